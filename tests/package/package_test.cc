#include "package/package.h"

#include <map>

#include "base/fs.h"
#include "package/aoti_metadata.h"
#include "package/archive.h"
#include "test_util.h"
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

}  // namespace
}  // namespace aotid::package
