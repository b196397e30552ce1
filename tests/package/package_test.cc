#include "package/package.h"

#include <map>

#include "base/fs.h"
#include "base/json.h"
#include "package/aoti_metadata.h"
#include "package/archive.h"
#include "test_util.h"
#include "text/generation.h"
#include "zip_util.h"

namespace aotid::package {
namespace {

using testing::TempDir;
using testing::TestData;
using testing::WriteZip;

constexpr char kCpuMetadata[] =
    R"({"AOTI_DEVICE_KEY": "cpu", "AOTI_PLATFORM": "linux", "AOTI_MACHINE": "x86_64", "AOTI_CPU_ISA": "AVX2"})";

TEST(PackageKind, EveryKindsNameParsesBackToThatKind) {
  for (PackageKind k :
       {PackageKind::kExportedProgram, PackageKind::kAotiCompiled, PackageKind::kAotiSource}) {
    auto back = ParsePackageKind(PackageKindName(k));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, k);
  }
  // The spellings are stored in the store's rows and passed to the build
  // child: they must not change.
  EXPECT_EQ(PackageKindName(PackageKind::kExportedProgram), "exported_program");
  EXPECT_EQ(PackageKindName(PackageKind::kAotiCompiled), "aoti_compiled");
  EXPECT_EQ(PackageKindName(PackageKind::kAotiSource), "aoti_source");
}

TEST(PackageKind, AnUnknownNameIsInvalidArgumentListingTheKinds) {
  auto bad = ParsePackageKind("aoti");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown package kind 'aoti' (expected one of exported_program, "
                                        "aoti_compiled, aoti_source)"),
            std::string::npos)
      << bad.status().message();
}

TEST(InspectPackage, ExportedProgramIsRecognised) {
  auto info = InspectPackage(TestData("mlp.pt2"));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->kind, PackageKind::kExportedProgram);
  EXPECT_EQ(info->model_names, std::vector<std::string>{"model"});
}

TEST(InspectPackage, CompiledSourceAndMultiModelPackagesAreToldApart) {
  auto so = InspectPackage(TestData("mlp_so.pt2"));
  ASSERT_TRUE(so.ok()) << so.status().ToString();
  EXPECT_EQ(so->kind, PackageKind::kAotiCompiled);
  auto src = InspectPackage(TestData("mlp_src.pt2"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ(src->kind, PackageKind::kAotiSource);
  auto multi = InspectPackage(TestData("multi.pt2"));
  ASSERT_TRUE(multi.ok()) << multi.status().ToString();
  EXPECT_EQ(multi->model_names, (std::vector<std::string>{"encoder", "head"}));
}

TEST(InspectPackage, NonZipAndEmptyZipAreRefusedWithReason) {
  auto text = InspectPackage(TestData("not_a_model.pt2"));
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("not a .pt2 package"), std::string::npos);
  auto empty = InspectPackage(TestData("empty.pt2"));
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("holds no model"), std::string::npos);
}

TEST(InspectPackage, AMissingFileIsNotFound) {
  TempDir d;
  EXPECT_EQ(InspectPackage(d / "absent.pt2").status().code(), StatusCode::kNotFound);
}

TEST(Archive, ReadsAndExtractsEntriesAndRefusesOversizedOnes) {
  TempDir d;
  WriteZip(d / "a.pt2", {{"root/a.txt", "hello"}, {"root/big.bin", std::string(4096, 'x')}});
  auto archive = Archive::Open(d / "a.pt2");
  ASSERT_TRUE(archive.ok()) << archive.status().ToString();
  EXPECT_EQ(archive->names().size(), 2u);
  auto a = archive->Read("root/a.txt");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, "hello");
  EXPECT_EQ(archive->Read("root/none").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(archive->Read("root/big.bin", 100).status().code(), StatusCode::kInvalidArgument);
  ASSERT_OK(archive->Extract("root/big.bin", d / "big.bin"));
  EXPECT_EQ(*fs::ReadFile(d / "big.bin"), std::string(4096, 'x'));
  EXPECT_EQ(AfterRoot("root/models/m.json"), "models/m.json");
  EXPECT_EQ(AfterRoot("no-root"), "");
}

// A 3 MB file that expands to gigabytes is refused when opened, before
// anything is extracted; an ordinary compressible entry is not.
TEST(Archive, ZipBombsAreRefusedBeforeExtraction) {
  TempDir d;
  WriteZip(d / "bomb.pt2", {{"root/data/aotinductor/model/model.cpp", std::string(size_t{64} << 20, '\0')}});
  auto bomb = Archive::Open(d / "bomb.pt2");
  ASSERT_FALSE(bomb.ok());
  EXPECT_EQ(bomb.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bomb.status().message().find("model.cpp expands from"), std::string::npos)
      << bomb.status().message();
  EXPECT_NE(bomb.status().message().find("zip bomb"), std::string::npos) << bomb.status().message();

  std::string text;
  for (int i = 0; text.size() < (size_t{20} << 20); ++i)
    text += "float tmp" + std::to_string(i) + " = x[i] * 2;\n";
  WriteZip(d / "code.pt2", {{"root/model.cpp", text}});
  EXPECT_TRUE(Archive::Open(d / "code.pt2").ok());
}

TEST(AotiMetadata, IsReadFromTheCompiledPackage) {
  auto md = ReadAotiMetadata(TestData("mlp_so.pt2"), "model");
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(md->device_key, "cpu");
  EXPECT_FALSE(md->platform.empty());
  EXPECT_FALSE(md->machine.empty());
  EXPECT_NE(md->json.find("AOTI_DEVICE_KEY"), std::string::npos);
  auto cuda = ReadAotiMetadata(TestData("cuda_so.pt2"), "model");
  ASSERT_TRUE(cuda.ok()) << cuda.status().ToString();
  EXPECT_EQ(cuda->device_key, "cuda");
  auto none = ReadAotiMetadata(TestData("mlp_so.pt2"), "nope");
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("no AOTInductor model 'nope'"), std::string::npos);
}

TEST(AotiMetadata, TheWrapperMetadataWinsAndDeeperEntriesAreNotTheModels) {
  TempDir d;
  WriteZip(d / "p.pt2", {{"p/data/aotinductor/model/kernel_metadata.json", R"({"AOTI_DEVICE_KEY": "cuda"})"},
                         {"p/data/aotinductor/model/wrapper_metadata.json", kCpuMetadata},
                         {"p/data/aotinductor/model/sub/x.so", "not this model's"},
                         {"p/data/aotinductor/model/m.so", "so"}});
  auto archive = Archive::Open(d / "p.pt2");
  ASSERT_TRUE(archive.ok()) << archive.status().ToString();
  auto md = ReadAotiMetadata(*archive, "model");
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(md->device_key, "cpu");
  EXPECT_EQ(md->cpu_isa, "AVX2");
  std::vector<std::string> entries = AotiModelEntries(*archive, "model");
  EXPECT_EQ(entries.size(), 3u);
  for (const auto& e : entries) EXPECT_EQ(e.find("/sub/"), std::string::npos) << e;
}

TEST(AotiMetadata, MetadataWithoutADeviceIsInvalidArgument) {
  TempDir d;
  WriteZip(d / "p.pt2", {{"p/data/aotinductor/model/wrapper_metadata.json", R"({"AOTI_PLATFORM": "linux"})"},
                         {"p/data/aotinductor/model/m.so", "so"}});
  auto md = ReadAotiMetadata(d / "p.pt2", "model");
  EXPECT_EQ(md.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(md.status().message().find("names no device"), std::string::npos) << md.status().message();
}

TEST(ExportRecord, DeclaresTheModelsSpecAndTheAuthorsMetadata) {
  auto archive = Archive::Open(TestData("mlp_so.pt2"));
  ASSERT_TRUE(archive.ok()) << archive.status().ToString();
  auto record = ReadExportRecord(*archive, "model");
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_NE(record->author_metadata.find("aotid test"), std::string::npos) << record->author_metadata;
  EXPECT_NE(record->model_spec.find("\"inputs\""), std::string::npos) << record->model_spec;
  auto raw = Archive::Open(TestData("mlp_so_raw.pt2"));
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  auto none = ReadExportRecord(*raw, "model");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->author_metadata, "{}");
  EXPECT_TRUE(none->model_spec.empty());
}

TEST(InspectPackage, MetadataNestedDeeperThanTheLimitIsRefusedNamingTheEntry) {
  // 30,000 levels once became a 1.7 GB package.json in the cache (written
  // indented) and 1.8 GB of the daemon's memory when read back.
  TempDir d;
  const std::string deep =
      R"({"format": 1, "metadata": {"x": )" + std::string(30000, '[') + std::string(30000, ']') + "}}";
  WriteZip(d / "p.pt2", {{"p/extra/aotid.json", deep},
                         {"p/data/aotinductor/model/wrapper_metadata.json", kCpuMetadata},
                         {"p/data/aotinductor/model/m.so", "so"}});
  auto info = InspectPackage(d / "p.pt2");
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(info.status().message().find("p/extra/aotid.json nests deeper than 16 levels at byte 46"),
            std::string::npos)
      << info.status().message();
}

TEST(InspectPackage, MetadataLargerThanTheLimitIsRefusedNamingTheEntry) {
  TempDir d;
  const std::string big = R"j({"AOTI_DEVICE_KEY": "cpu", "pad": ")j" + std::string(2 << 20, 'x') + "\"}";
  WriteZip(d / "p.pt2", {{"p/data/aotinductor/model/wrapper_metadata.json", big},
                         {"p/data/aotinductor/model/m.so", "so"}});
  auto info = InspectPackage(d / "p.pt2");
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("wrapper_metadata.json is too large"), std::string::npos)
      << info.status().message();
  // Within the limits, the same package is a compiled one.
  WriteZip(d / "q.pt2", {{"p/data/aotinductor/model/wrapper_metadata.json", kCpuMetadata},
                         {"p/extra/aotid.json", R"({"format": 1, "metadata": {"x": [[[[1]]]]}})"},
                         {"p/data/aotinductor/model/m.so", "so"}});
  auto fine = InspectPackage(d / "q.pt2");
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_EQ(fine->kind, PackageKind::kAotiCompiled);
}

TEST(ExportRecord, ARecordThatIsNotJsonIsRefusedAtAddAndShowsNoAuthorMetadata) {
  TempDir d;
  WriteZip(d / "p.pt2", {{"p/extra/aotid.json", "not json"}, {"p/data/aotinductor/model/m.so", "so"}});
  auto archive = Archive::Open(d / "p.pt2");
  ASSERT_TRUE(archive.ok()) << archive.status().ToString();
  EXPECT_EQ(ReadExportRecord(*archive, "model").status().code(), StatusCode::kInvalidArgument);
  auto info = InspectPackage(d / "p.pt2");
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("p/extra/aotid.json is not valid JSON at byte 1 (near 'not json')"),
            std::string::npos)
      << info.status().message();
  auto record = ReadPackageRecord(d / "p.pt2");
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ(record->author_metadata, "{}");
  EXPECT_EQ(record->package_options, "{}");
}

TEST(ExportRecord, TheOptionsAPackageAsksForAreRead) {
  TempDir d;
  WriteZip(d / "p.pt2", {{"p/extra/aotid.json", R"({"format":1,"metadata":{"weights":"int8"},
                                                   "inductor_options":{"max_autotune":true}})"},
                         {"p/data/aotinductor/model/m.so", "so"}});
  auto record = ReadPackageRecord(d / "p.pt2");
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ(record->author_metadata, R"({"weights":"int8"})");
  EXPECT_EQ(record->package_options, R"({"max_autotune":true})");
  WriteZip(d / "q.pt2", {{"p/extra/aotid.json", R"({"format":1,"inductor_options":"max_autotune"})"},
                         {"p/data/aotinductor/model/m.so", "so"}});
  record = ReadPackageRecord(d / "q.pt2");
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ(record->package_options, "{}");  // not an object: the build says why
}

TEST(ExternalWeights, WeightsOutsideTheCompiledCodeAreFound) {
  TempDir d;
  WriteZip(d / "in.pt2", {{"p/data/aotinductor/model/m.so", "so"}});
  WriteZip(d / "out.pt2", {{"p/data/aotinductor/model/m.so", "so"}, {"p/data/weights/w0", "w"}});
  auto inside = Archive::Open(d / "in.pt2");
  auto outside = Archive::Open(d / "out.pt2");
  ASSERT_TRUE(inside.ok() && outside.ok());
  EXPECT_EQ(ExternalWeightsEntry(*inside), "");
  EXPECT_EQ(ExternalWeightsEntry(*outside), "p/data/weights/w0");
}

// The record's own words for what a model is for: a language model's
// "generate" section, a sentence encoder's "embed", a model's own under
// "models" before the package's.
TEST(ExportRecord, SaysWhatEachModelIsFor) {
  auto record = ReadPackageRecord(TestData("tiny_llm.pt2"), "model");
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ(record->task, "generate");
  record = ReadPackageRecord(TestData("mlp_so.pt2"), "model");
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ(record->task, "");
  TempDir d;
  WriteZip(d / "p.pt2", {{"p/extra/aotid.json", R"({"format":1,"generate":{"max_seq_len":8},
                                                   "models":{"enc":{"generate":null,"embed":{"dim":4}},
                                                             "plain":{"generate":null}}})"},
                         {"p/data/aotinductor/model/m.so", "so"}});
  for (auto [model, task] :
       std::map<std::string, std::string>{{"model", "generate"}, {"enc", "embed"}, {"plain", ""}}) {
    record = ReadPackageRecord(d / "p.pt2", model);
    ASSERT_TRUE(record.ok()) << record.status().ToString();
    EXPECT_EQ(record->task, task) << model;
  }
}

TEST(ReadTaskSpec, IsTheSectionWithItsTokenizerAsTheBuildWritesIt) {
  auto archive = Archive::Open(TestData("tiny_llm.pt2"));
  ASSERT_TRUE(archive.ok()) << archive.status().ToString();
  auto text = ReadTaskSpec(*archive, "model");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto spec = text::GenerateSpec::FromJson(*text);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  // As the package's record says.
  auto record = ParseJson(archive->Read("tiny_llm/extra/aotid.json").value(), "record");
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  const nlohmann::json& generate = (*record)["generate"];
  EXPECT_EQ(spec->max_seq_len, generate["max_seq_len"].get<int64_t>());
  EXPECT_EQ(spec->eos_ids, generate["eos_token_ids"].get<std::vector<int32_t>>());
  EXPECT_TRUE(spec->chat.has_value());
  auto tokenizer = ParseJson(archive->Read("tiny_llm/extra/aotid_tokenizer.json").value(), "tokenizer");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  ASSERT_NE(spec->tokenizer, nullptr);
  EXPECT_EQ(spec->tokenizer->vocab_size(), static_cast<int32_t>((*tokenizer)["tokens"].size()));

  auto mlp = Archive::Open(TestData("mlp_so.pt2"));
  ASSERT_TRUE(mlp.ok()) << mlp.status().ToString();
  EXPECT_EQ(ReadTaskSpec(*mlp, "model").value(), "");

  TempDir d;
  WriteZip(d / "p.pt2", {{"p/extra/aotid.json", R"({"format":1,"embed":{"dim":4,"tokenizer":"tok.json"}})"},
                         {"p/data/aotinductor/model/m.so", "so"}});
  auto lacking = Archive::Open(d / "p.pt2");
  ASSERT_TRUE(lacking.ok()) << lacking.status().ToString();
  auto none = ReadTaskSpec(*lacking, "model");
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(
      none.status().message().find("\"embed\" names the tokenizer file 'tok.json', which the package lacks"),
      std::string::npos)
      << none.status().message();
}

// One weight of `dtype` (torch's export schema number) and `elements`
// elements, stored as `path`, as the weights list has it.
std::string Weight(const std::string& name, const std::string& path, int dtype, int elements) {
  return "\"" + name + "\": {\"path_name\": \"" + path +
         "\", \"is_param\": true, \"tensor_meta\": {\"dtype\": " + std::to_string(dtype) +
         ", \"sizes\": [{\"as_int\": " + std::to_string(elements) + "}]}}";
}

TEST(WeightsKind, IsTheDtypeMostOfTheWeightsBytesAreIn) {
  auto kind = [](const std::string& file) {
    auto archive = Archive::Open(TestData(file));
    EXPECT_TRUE(archive.ok()) << archive.status().ToString();
    return archive.ok() ? WeightsKind(*archive, "model") : "?";
  };
  EXPECT_EQ(kind("tiny_llm.pt2"), "float32");
  // The quantized model's author says what its weights are.
  auto author = ParseJson(ReadPackageRecord(TestData("tiny_llm_int8.pt2"))->author_metadata, "metadata");
  ASSERT_TRUE(author.ok()) << author.status().ToString();
  EXPECT_EQ(kind("tiny_llm_int8.pt2"), (*author)["weights"].get<std::string>());
  EXPECT_EQ(kind("mlp_so.pt2"), "");  // compiled: the weights are in its code

  // Tied weights (one stored tensor under two names) count once: 40 bytes
  // of float32 against 60 of bfloat16.
  TempDir d;
  WriteZip(d / "p.pt2", {{"p/data/weights/model_weights_config.json",
                          "{\"config\": {" + Weight("a", "w0", 7, 10) + ", " + Weight("b", "w0", 7, 10) +
                              ", " + Weight("c", "w1", 13, 30) + "}}"},
                         {"p/models/model.json", "{}"}});
  auto tied = Archive::Open(d / "p.pt2");
  ASSERT_TRUE(tied.ok()) << tied.status().ToString();
  EXPECT_EQ(WeightsKind(*tied, "model"), "bfloat16");
  EXPECT_EQ(WeightsKind(*tied, "other"), "");
}

}  // namespace
}  // namespace aotid::package
