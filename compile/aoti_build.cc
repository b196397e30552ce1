#include "compile/aoti_build.h"

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "base/fs.h"
#include "base/json.h"
#include "base/shell.h"
#include "compile/build_cache.h"
#include "package/archive.h"

namespace aotid::compile {
namespace {

// A source package's compiler and linker flags come from the package:
// flags that run other programs, load plugins, read files into the
// command line or put output elsewhere are refused (the build child is
// confined too, but a flag has no business doing any of this).
Status CheckCompilerFlag(const std::string& flag) {
  static const char* const kRefused[] = {"-wrapper",
                                         "-fplugin",
                                         "-B",
                                         "-specs",
                                         "--specs",
                                         "--sysroot",
                                         "-isysroot",
                                         "-iprefix",
                                         "-Xlinker",
                                         "-Xassembler",
                                         "-Xpreprocessor",
                                         "-Wa,",
                                         "-Wp,",
                                         "-save-temps",
                                         "-dumpdir",
                                         "-o",
                                         "-MF",
                                         "-MD",
                                         "-include",
                                         "-imacros",
                                         "-fdump",
                                         "-fprofile",
                                         "--plugin",
                                         "-T"};
  bool bad = flag.empty() || flag[0] != '-' || flag.find("plugin") != std::string::npos;
  for (const char* r : kRefused) bad = bad || flag.starts_with(r);
  if (flag.starts_with("-Wl,"))
    bad = bad || flag.find(",-T") != std::string::npos || flag.find(",--script") != std::string::npos;
  if (bad)
    return InvalidArgument("the source package asks for the compiler flag '" + flag.substr(0, 80) +
                           "', which aotid does not pass on");
  return Status::OK();
}

}  // namespace

OpenMpFlags OpenMpFlagsFor(const std::string& os) {
  if (os == "darwin") return {{"-Xclang", "-fopenmp"}, {"-lomp"}};
  return {{"-fopenmp"}, {"-fopenmp"}};
}

namespace {

using nlohmann::json;
using package::AotiMetadata;
using package::Archive;
using package::PackageKind;

std::string Basename(const std::string& p) { return p.substr(p.rfind('/') + 1); }

// CPU features a package's AOTI_CPU_ISA token needs, by platform.
const std::map<std::string, std::vector<std::string>>& IsaNeeds() {
  static const auto* m = new std::map<std::string, std::vector<std::string>>{
      {"AVX2", {"avx2", "fma"}},
      {"AVX512", {"avx512f", "avx512dq", "avx512vl", "avx512bw"}},
      {"AVX512_VNNI", {"avx512_vnni"}},
      {"AMX_TILE", {"amx_tile", "amx_bf16", "amx_int8"}},
      {"SVE", {"sve"}},
  };
  return *m;
}

std::string UpperIsa(const platform::HardwareInfo& hw) {
  std::string s = hw.vector_isa;
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s == "DEFAULT" ? "no vector extensions" : s;
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(s.begin());
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

const std::map<std::string, model::DType>& AotiDtypes() {
  static const auto* m = new std::map<std::string, model::DType>{
      {"bool", model::DType::kBool},       {"uint8", model::DType::kUInt8},
      {"int8", model::DType::kInt8},       {"int16", model::DType::kInt16},
      {"int32", model::DType::kInt32},     {"int64", model::DType::kInt64},
      {"float16", model::DType::kFloat16}, {"bfloat16", model::DType::kBFloat16},
      {"float32", model::DType::kFloat32}, {"float64", model::DType::kFloat64},
      {"uint16", model::DType::kUInt16},   {"uint32", model::DType::kUInt32},
      {"uint64", model::DType::kUInt64}};
  return *m;
}

// Copies the model's kernel files (IsKernelFile) out of the package beside
// model.so: its runner is told to look for them there (bin_dir), by name.
Status ExtractKernelFiles(const Archive& archive, const std::vector<std::string>& files,
                          const std::string& out_dir, std::ostream& log) {
  int kept = 0;
  for (const auto& f : files) {
    std::string base = Basename(f);
    if (!IsKernelFile(base)) continue;
    RETURN_IF_ERROR(archive.Extract(f, out_dir + "/" + base));
    ++kept;
  }
  if (kept > 0) log << "kept " << kept << " kernel file" << (kept == 1 ? "" : "s") << " beside model.so\n";
  return Status::OK();
}

}  // namespace

Status CheckFitsMachine(const AotiMetadata& m, const platform::HardwareInfo& hw) {
  if (!m.platform.empty() && m.platform != hw.os) {
    return FailedPrecondition("package was compiled for " + m.platform + ", this machine runs " + hw.os);
  }
  auto norm = [](std::string a) { return a == "aarch64" ? std::string("arm64") : a; };
  if (!m.machine.empty() && norm(m.machine) != norm(hw.arch)) {
    return FailedPrecondition("package was compiled for " + m.machine + " CPUs, this machine is " + hw.arch);
  }
  if (m.device_key != "cpu") return Status::OK();  // the ISA only matters for CPU kernels
  std::istringstream tokens(m.cpu_isa);
  std::string token;
  std::set<std::string> have(hw.cpu_features.begin(), hw.cpu_features.end());
  while (tokens >> token) {
    std::string base = token.rfind("SVE", 0) == 0 ? "SVE" : token;
    auto it = IsaNeeds().find(base);
    if (it == IsaNeeds().end()) continue;  // NEON/ASIMD on every arm64; INVALIDVECISA: scalar code
    std::string missing;
    for (const auto& f : it->second) {
      if (!have.count(f)) missing += (missing.empty() ? "" : " ") + f;
    }
    if (!missing.empty()) {
      return FailedPrecondition("package was compiled for " + m.cpu_isa + ", this CPU has " + UpperIsa(hw) +
                                " only (it lacks " + missing + ")");
    }
  }
  return Status::OK();
}

Status CheckPackageDevice(const AotiMetadata& m, const platform::HardwareInfo& hw) {
  Status here = platform::DeviceAvailable(hw, m.device_key);
  if (here.ok()) return here;
  return FailedPrecondition("package was built for " + m.device_key + "; this machine has none (" +
                            here.message() + ")");
}

StatusOr<DerivedInputs> DeriveInputsFromSource(const std::string& cpp) {
  DerivedInputs d;
  static const std::regex kInputName(R"re(inputs_info_\[(\d+)\]\.name = "([^"]*)";)re");
  static const std::regex kOutputName(R"re(outputs_info_\[(\d+)\]\.name = "([^"]*)";)re");
  std::map<int, std::string> in_names, out_names;
  for (std::sregex_iterator it(cpp.begin(), cpp.end(), kInputName), end; it != end; ++it) {
    in_names[std::stoi((*it)[1])] = (*it)[2];
  }
  for (std::sregex_iterator it(cpp.begin(), cpp.end(), kOutputName), end; it != end; ++it) {
    out_names[std::stoi((*it)[1])] = (*it)[2];
  }
  if (in_names.empty() && out_names.empty()) {
    return InvalidArgument("the package's C++ does not name the model's inputs and outputs");
  }
  for (const auto& [i, name] : out_names) d.output_names.push_back(name);
  static const std::regex kDtype(R"re(_expected_dtype = aoti_torch_dtype_(\w+)\(\))re");
  static const std::regex kFixed(R"re(if \((\d+) != \w+_size\[(\d+)\]\))re");
  static const std::regex kMin(R"re(if \(\w+_size\[(\d+)\] < (\d+)\))re");
  static const std::regex kMax(R"re(if \(\w+_size\[(\d+)\] > (\d+)\))re");
  static const std::regex kAnyDim(R"re(\w+_(?:size|stride)\[(\d+)\])re");
  for (const auto& [i, name] : in_names) {
    std::string head = "static void check_input_" + std::to_string(i) + "(";
    size_t start = cpp.find(head);
    if (start == std::string::npos) {
      return InvalidArgument("the package's C++ has no input check for input " + std::to_string(i) + " ('" +
                             name +
                             "'), so its datatype and shape are unknown; export it with aotid_export to "
                             "record them");
    }
    size_t stop = cpp.find("\n}\n", start);
    std::string body = cpp.substr(start, stop == std::string::npos ? std::string::npos : stop - start);
    std::smatch m;
    model::TensorSpec t;
    t.name = name;
    if (!std::regex_search(body, m, kDtype) || !AotiDtypes().count(m[1])) {
      return InvalidArgument("input '" + name + "' has a datatype aotid cannot serve (" +
                             (m.size() > 1 ? m[1].str() : std::string("unknown")) + ")");
    }
    t.dtype = AotiDtypes().at(m[1]);
    int rank = 0;
    for (std::sregex_iterator it(body.begin(), body.end(), kAnyDim), end; it != end; ++it) {
      rank = std::max(rank, std::stoi((*it)[1]) + 1);
    }
    t.shape.assign(rank, -1);
    std::vector<int64_t> min_shape(rank, 1);
    for (std::sregex_iterator it(body.begin(), body.end(), kFixed), end; it != end; ++it) {
      int dim = std::stoi((*it)[2]);
      t.shape[dim] = min_shape[dim] = std::stoll((*it)[1]);
    }
    for (std::sregex_iterator it(body.begin(), body.end(), kMin), end; it != end; ++it) {
      int dim = std::stoi((*it)[1]);
      if (t.shape[dim] == -1) min_shape[dim] = std::max<int64_t>(1, std::stoll((*it)[2]));
    }
    // An upper bound is kept as the dim's range, for the daemon to check:
    // the kernels may index tables of that size. The lower bound is not:
    // torch.export traces a dynamic dim as at least 2, and the kernels run
    // 1 correctly.
    for (std::sregex_iterator it(body.begin(), body.end(), kMax), end; it != end; ++it) {
      int dim = std::stoi((*it)[1]);
      if (t.shape[dim] != -1) continue;
      if (t.dims.empty()) t.dims.resize(static_cast<size_t>(rank));
      model::DimRange r;
      r.min = 1;
      r.max = std::stoll((*it)[2]);
      t.dims[static_cast<size_t>(dim)] = r;
    }
    d.inputs.push_back(std::move(t));
    d.min_shapes.push_back(std::move(min_shape));
  }
  return d;
}

Status CheckDeclaredAgainstChecks(const DerivedInputs& compiled, model::ModelSpec* declared,
                                  std::vector<std::vector<int64_t>>* min_shapes, std::ostream& log) {
  if (compiled.inputs.size() != declared->inputs.size()) {
    return InvalidArgument("extra/aotid.json declares " + std::to_string(declared->inputs.size()) +
                           " inputs but the model's C++ checks " + std::to_string(compiled.inputs.size()));
  }
  min_shapes->clear();
  for (size_t i = 0; i < compiled.inputs.size(); ++i) {
    const model::TensorSpec& c = compiled.inputs[i];
    model::TensorSpec& t = declared->inputs[i];
    const std::string who = "extra/aotid.json declares input '" + t.name + "'";
    if (c.dtype != t.dtype) {
      return InvalidArgument(who + " as " + std::string(model::DTypeName(t.dtype)) +
                             " but the model's C++ takes " + std::string(model::DTypeName(c.dtype)));
    }
    // A scalar input's check names no dim; a rank of 0 there says nothing.
    if (!c.shape.empty() && c.shape.size() != t.shape.size()) {
      return InvalidArgument(who + " with shape " + model::ShapeString(t.shape) +
                             " but the model's C++ takes " + model::ShapeString(c.shape));
    }
    std::vector<int64_t> run_shape = t.shape;
    for (size_t d = 0; d < c.shape.size(); ++d) {
      if (c.shape[d] >= 0 && t.shape[d] >= 0 && c.shape[d] != t.shape[d]) {
        return InvalidArgument(who + " with shape " + model::ShapeString(t.shape) +
                               " but the model's C++ takes " + model::ShapeString(c.shape) + " (dim " +
                               std::to_string(d) + ")");
      }
      if (c.shape[d] >= 0 && t.shape[d] < 0) {
        log << "input '" << t.name << "' dim " << d << " is declared dynamic; the model's C++ takes only "
            << c.shape[d] << ", so only that is accepted\n";
        t.shape[d] = c.shape[d];
        if (!t.dims.empty()) t.dims[d].reset();
      }
      if (t.shape[d] < 0 && !c.dims.empty() && c.dims[d]) {
        if (t.dims.empty()) t.dims.resize(t.shape.size());
        model::DimRange r = t.dims[d].value_or(model::DimRange{});
        r.min = std::max<int64_t>(r.min, 1);
        r.max = std::min(r.max, c.dims[d]->max);
        if (r.min > r.max) {
          return InvalidArgument(who + " dim " + std::to_string(d) + " as at least " + std::to_string(r.min) +
                                 " but the model's C++ takes at most " + std::to_string(c.dims[d]->max));
        }
        t.dims[d] = r;
      }
      run_shape[d] = t.shape[d];
      if (run_shape[d] < 0) {
        run_shape[d] = compiled.min_shapes[i][d];
        if (!t.dims.empty() && t.dims[d]) run_shape[d] = std::min(run_shape[d], t.dims[d]->max);
      }
    }
    min_shapes->push_back(std::move(run_shape));
  }
  return Status::OK();
}

StatusOr<PackageBuildResult> BuildFromAotiPackage(const PackageBuildRequest& req,
                                                  const platform::HardwareInfo& hw, std::ostream& log) {
  if (req.kind != PackageKind::kAotiCompiled && req.kind != PackageKind::kAotiSource) {
    return InvalidArgument("not an AOTInductor package kind: " +
                           std::string(package::PackageKindName(req.kind)));
  }
  ASSIGN_OR_RETURN(Archive archive, Archive::Open(req.artifact_path));
  if (std::string outside = package::ExternalWeightsEntry(archive); !outside.empty()) {
    return InvalidArgument("the package keeps its weights outside the compiled code (" + outside +
                           "); aotid loads packages whose weights are inside (AOTInductor's default, "
                           "aot_inductor.package_constants_in_so=True)");
  }
  std::vector<std::string> files = package::AotiModelEntries(archive, req.package_model);

  PackageBuildResult result;
  ASSIGN_OR_RETURN(result.metadata, package::ReadAotiMetadata(archive, req.package_model));
  const AotiMetadata& md = result.metadata;
  log << "package metadata: device " << md.device_key << ", platform " << md.platform << ", machine "
      << md.machine << ", CPU ISA " << md.cpu_isa << "\n";
  if (md.device_key != req.device) {
    return FailedPrecondition("package was compiled for device '" + md.device_key + "', not '" + req.device +
                              "'");
  }
  RETURN_IF_ERROR(CheckFitsMachine(md, hw));

  // The interface: declared by the exporter, or read from the C++.
  std::string cpp_text;
  for (const auto& f : files) {
    if (f.ends_with(".cpp") && (cpp_text.empty() || f.find("wrapper") != std::string::npos)) {
      ASSIGN_OR_RETURN(cpp_text, archive.Read(f));
    }
  }
  ASSIGN_OR_RETURN(package::ExportRecord record, package::ReadExportRecord(archive, req.package_model));
  result.author_metadata = record.author_metadata;
  if (!record.model_spec.empty()) {
    auto spec = model::ModelSpec::FromJson(record.model_spec);
    if (!spec.ok()) return spec.status().WithContext("extra/aotid.json");
    result.spec = std::move(spec).value();
    result.outputs_declared = true;
    // What the package declares must be what its compiled checks take: a
    // declared shape the kernels were not compiled for would have them read
    // past their inputs. (The daemon checks requests against the spec; the
    // build child then runs the model under its own checks too, which holds
    // for a compiled package whose C++ is not the .so's.)
    if (!cpp_text.empty()) {
      auto compiled = DeriveInputsFromSource(cpp_text);
      if (compiled.ok()) {
        RETURN_IF_ERROR(CheckDeclaredAgainstChecks(*compiled, &result.spec, &result.min_shapes, log));
      } else {
        log << "the package's C++ does not show its input checks (" << compiled.status().message() << ")\n";
      }
    }
  }
  if (!result.outputs_declared) {
    if (cpp_text.empty()) {
      return InvalidArgument(
          "the package neither declares its inputs and outputs (extra/aotid.json) nor carries "
          "its C++ to read them from; export it with aotid_export");
    }
    ASSIGN_OR_RETURN(DerivedInputs d, DeriveInputsFromSource(cpp_text));
    result.spec.inputs = std::move(d.inputs);
    result.min_shapes = std::move(d.min_shapes);
    log << "inputs read from the package's C++: " << result.spec.inputs.size()
        << "; outputs found by a first run\n";
  }
  if (result.min_shapes.empty()) {
    for (const auto& t : result.spec.inputs) {
      std::vector<int64_t> s = t.shape;
      for (auto& d : s) d = d < 0 ? 1 : d;
      result.min_shapes.push_back(s);
    }
  }

  std::string so_out = req.out_dir + "/model.so";
  if (req.kind == PackageKind::kAotiCompiled) {
    std::vector<std::string> sos;
    for (const auto& f : files) {
      if (f.ends_with(".so")) sos.push_back(f);
    }
    if (sos.size() != 1) {
      return InvalidArgument("the package holds " + std::to_string(sos.size()) + " .so files for '" +
                             req.package_model + "', expected 1");
    }
    log << "copying " << Basename(sos[0]) << " out of the package\n";
    RETURN_IF_ERROR(archive.Extract(sos[0], so_out));
    RETURN_IF_ERROR(ExtractKernelFiles(archive, files, req.out_dir, log));
    return result;
  }

  // A source package: compile its C++ here with the recorded flags.
  std::string src = req.out_dir + "/src";
  RETURN_IF_ERROR(fs::MakeDirs(src));
  std::vector<std::string> cpps, objects;
  std::string compile_flags_name, linker_flags_name;
  for (const auto& f : files) {
    std::string base = Basename(f);
    if (base.ends_with("_compile_flags.json")) compile_flags_name = f;
    if (base.ends_with("_linker_flags.json")) linker_flags_name = f;
    if (!base.ends_with(".cpp") && !base.ends_with(".o")) continue;
    RETURN_IF_ERROR(archive.Extract(f, src + "/" + base));
    (base.ends_with(".cpp") ? cpps : objects).push_back(src + "/" + base);
  }
  if (cpps.empty() || compile_flags_name.empty()) {
    return InvalidArgument("the source package has no C++ or no compile flags for '" + req.package_model +
                           "'");
  }
  ASSIGN_OR_RETURN(std::string cf_text, archive.Read(compile_flags_name));
  json cf = ParseJsonOrDiscarded(cf_text);
  json lf = json::object();
  if (!linker_flags_name.empty()) {
    ASSIGN_OR_RETURN(std::string lf_text, archive.Read(linker_flags_name));
    lf = ParseJsonOrDiscarded(lf_text);
  }
  if (!cf.is_object() || !lf.is_object())
    return InvalidArgument("the source package's build flags are not JSON objects");
  auto strings = [](const json& j, const char* key) {
    std::vector<std::string> out;
    if (j.contains(key) && j[key].is_array()) {
      for (const auto& v : j[key]) {
        if (v.is_string() && !Trim(v.get<std::string>()).empty()) out.push_back(Trim(v.get<std::string>()));
      }
    }
    return out;
  };
  // The exporting machine's include and library paths are replaced by this
  // machine's torch, and its OpenMP flags by this platform's; everything
  // else (defines, optimisation, the vector ISA flags) is kept, so the
  // kernels match the ISA the metadata declares.
  std::vector<std::string> cflags;
  bool openmp = false;
  for (const auto& f : strings(cf, "cflags")) {
    if (f != "fopenmp") {
      cflags.push_back(f);
      continue;
    }
    openmp = true;  // -fopenmp, or Apple clang's -Xclang -fopenmp
    if (!cflags.empty() && cflags.back() == "Xclang") cflags.pop_back();
  }
  const OpenMpFlags omp = OpenMpFlagsFor(hw.os);
  std::string compile = ShellQuote(req.cxx) + " -c";
  for (const auto& d : strings(cf, "definitions")) compile += " -D" + ShellQuote(d);
  compile += " -I" + ShellQuote(req.torch_dir + "/include") + " -I" +
             ShellQuote(req.torch_dir + "/include/torch/csrc/api/include");
  for (const auto& f : cflags) {
    if (f == "shared") continue;
    RETURN_IF_ERROR(CheckCompilerFlag("-" + f));
    compile += " -" + ShellQuote(f);
  }
  if (openmp) {
    for (const auto& f : omp.compile) compile += " " + ShellQuote(f);
  }
  // Words separated by spaces, each a flag of its own: never shell text.
  for (const auto& p : strings(cf, "passthrough_args")) {
    std::istringstream words(p);
    for (std::string w; words >> w;) {
      RETURN_IF_ERROR(CheckCompilerFlag(w));
      compile += " " + ShellQuote(w);
    }
  }
  compile += " -w";  // torch's headers warn by the hundred under -Wall -pedantic; errors are what matter here
  std::vector<std::string> objs = objects;
  for (size_t i = 0; i < cpps.size(); ++i) {
    std::string obj = src + "/compiled" + std::to_string(i) + ".o";
    std::string cmd = compile + " " + ShellQuote(cpps[i]) + " -o " + ShellQuote(obj);
    log << "compiling " << Basename(cpps[i]) << ":\n  " << cmd << "\n" << std::flush;
    ShellResult r = RunShell("{ " + cmd + " 2>&1; }");  // the compiler's messages are the log
    log << r.out << std::flush;
    if (r.exit_code != 0) {
      // The compiler's error lines are what a person needs.
      std::string errors;
      std::istringstream lines(r.out);
      int n = 0;
      for (std::string line; std::getline(lines, line) && n < 10;) {
        if (line.find("error") == std::string::npos) continue;
        errors += "\n  " + line;
        ++n;
      }
      if (errors.empty()) errors = "\n" + r.out.substr(0, 2000);
      return InvalidArgument("the package's C++ does not compile with " + req.cxx + " (exit " +
                             std::to_string(r.exit_code) + "):" + errors);
    }
    objs.push_back(obj);
  }
  std::string link = ShellQuote(req.cxx) + " -shared -fPIC -o " + ShellQuote(so_out);
  for (const auto& o : objs) link += " " + ShellQuote(o);
  link += " -L" + ShellQuote(req.torch_dir + "/lib") + " -Wl,-rpath," + ShellQuote(req.torch_dir + "/lib");
  for (const auto& f : strings(lf, "ldflags")) {
    RETURN_IF_ERROR(CheckCompilerFlag("-" + f));
    link += " -" + ShellQuote(f);
  }
  for (const auto& l : strings(lf, "libraries")) {
    if (l == "omp" || l == "gomp") continue;  // the OpenMP runtime: this platform's, below
    RETURN_IF_ERROR(CheckCompilerFlag("-l" + l));
    link += " -l" + ShellQuote(l);
  }
  if (openmp) {
    for (const auto& f : omp.link) link += " " + ShellQuote(f);
  }
  log << "linking model.so:\n  " << link << "\n" << std::flush;
  ShellResult r = RunShell("{ " + link + " 2>&1; }");
  log << r.out << std::flush;
  if (r.exit_code != 0) {
    return InvalidArgument("linking the package's objects failed (exit " + std::to_string(r.exit_code) +
                           "):\n" + r.out);
  }
  (void)fs::RemoveAll(src);
  RETURN_IF_ERROR(ExtractKernelFiles(archive, files, req.out_dir, log));
  return result;
}

}  // namespace aotid::compile
