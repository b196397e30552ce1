// What an AOTInductor package (`aoti_compiled` or `aoti_source`) says about
// its models, read without torch:
//
//   <root>/data/aotinductor/<model>/*_metadata.json   AOTInductor's metadata
//                                                     (device, platform, CPU ISA)
//   <root>/data/aotinductor/<model>/*.so | *.cpp ...  the compiled model or its C++
//   <root>/extra/aotid.json                           aotid_export's record: the
//                                                     author's metadata and each
//                                                     model's inputs and outputs
//
// Whether the package fits a machine, and building it, are runtime's
// (compile/aoti_build.h).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "package/archive.h"

namespace aotid::package {

struct AotiMetadata {
  std::string device_key;  // AOTI_DEVICE_KEY: cpu, cuda, mps, ...
  std::string platform;    // AOTI_PLATFORM: linux, darwin, ...
  std::string machine;     // AOTI_MACHINE: x86_64, arm64, ...
  std::string cpu_isa;     // AOTI_CPU_ISA: AVX2, AVX512, "AVX512 AVX512_VNNI", NEON, ...
  std::string json;        // all of it, as the package has it
};

// The entries of one model, <root>/data/aotinductor/<model>/<file> (files
// directly in that folder), in the archive's order; empty when the package
// has no such model.
std::vector<std::string> AotiModelEntries(const Archive& archive, const std::string& package_model);

// The metadata of one model (the wrapper's when the package has several
// *_metadata.json files for it). InvalidArgument when the package has no
// such model, no metadata for it, or metadata that names no device.
StatusOr<AotiMetadata> ReadAotiMetadata(const Archive& archive, const std::string& package_model);
// The same, opening the package at `path` (Archive::Open's errors).
StatusOr<AotiMetadata> ReadAotiMetadata(const std::string& path, const std::string& package_model);

// Every JSON document of the package that aotid copies into its store, its
// cache and a registry (each model's AOTInductor metadata, extra/aotid.json):
// OK when each is JSON within 1 MiB and 16 levels of nesting; otherwise
// InvalidArgument naming the entry, the limit and the place. Add and sync
// refuse a package that fails it (InspectPackage), so nothing a package
// holds grows without bound on its way into the cache.
Status CheckPackageMetadata(const Archive& archive);

// aotid_export's record in <root>/extra/aotid.json.
struct ExportRecord {
  // The author's metadata (its "metadata" object) as JSON text; "{}" without.
  std::string author_metadata = "{}";
  // The model's declared {"inputs": [...], "outputs": [...]} as JSON text;
  // empty when the record does not declare both for that model.
  std::string model_spec;
  // The AOTInductor options the package asks to be built with (its
  // "inductor_options" object) as JSON text; "{}" without. The compile
  // worker checks them; the owner's settings override them.
  std::string package_options = "{}";
  // What the model is for: "generate" (a language model: the record has a
  // "generate" section for it), "embed" (a sentence encoder: an "embed"
  // section), or "" (tensors in, tensors out).
  std::string task;
};
// The record for `package_model`; the defaults above when the package has
// none. InvalidArgument when extra/aotid.json is there but not a JSON object.
StatusOr<ExportRecord> ReadExportRecord(const Archive& archive, const std::string& package_model);

// The record of the package at `path` (its author's metadata, the options
// it asks for, what `package_model` is for); the defaults when it has none
// or its record is not JSON.
StatusOr<ExportRecord> ReadPackageRecord(const std::string& path, const std::string& package_model = "");

// The record's section for `package_model`'s task ("generate" or "embed",
// ExportRecord::task) with the tokenizer file it names read in, as the
// build's generate.json or embed.json holds it: the text
// text::GenerateSpec::FromJson or serving::EmbedSpec::FromJson reads. ""
// for a model without one; InvalidArgument when the file it names is not
// in the package.
StatusOr<std::string> ReadTaskSpec(const Archive& archive, const std::string& package_model);

// The kind of `package_model`'s weights, from the exported program's list
// of them (<root>/data/weights/<model>_weights_config.json): the dtype most
// of their bytes are in, as torch names it ("float32", "int8" for
// quantized weights with float scales, "bfloat16"). "" when the package
// lists none (an AOTInductor package keeps them in its compiled code) or
// its list cannot be read.
std::string WeightsKind(const Archive& archive, const std::string& package_model);

// The first entry that keeps weights outside the compiled code
// (<root>/data/weights/..., <root>/data/constants/...), or "" when the
// weights are inside (AOTInductor's default, package_constants_in_so).
std::string ExternalWeightsEntry(const Archive& archive);

}  // namespace aotid::package
