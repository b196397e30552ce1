#include "runtime/tensor.h"

#include "base/fs.h"
#include "runtime/build_cache.h"
#include "runtime/hardware.h"
#include "test_util.h"

namespace aotid::runtime {
namespace {

using testing::TempDir;

HostTensor Tensor(DType d, std::vector<int64_t> shape) {
  HostTensor t;
  t.name = "x";
  t.dtype = d;
  t.shape = std::move(shape);
  t.data.resize(static_cast<size_t>(t.num_elements()) * DTypeSize(d));
  return t;
}

TEST(Tensor, DTypeNamesRoundTrip) {
  for (DType d : {DType::kBool, DType::kUInt8, DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64,
                  DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    DType back;
    ASSERT_TRUE(ParseDType(DTypeName(d), &back));
    EXPECT_EQ(back, d);
  }
  DType unused;
  EXPECT_FALSE(ParseDType("BYTES", &unused));
}

TEST(Tensor, NumElementsDetectsOverflow) {
  EXPECT_EQ(NumElements({2, 3, 4}), 24);
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({1 << 30, 1 << 30, 1 << 30}), -1);
  EXPECT_EQ(NumElements({-1, 4}), -1);
}

TEST(Tensor, CheckAgainstSpecNamesInputAndExpectation) {
  TensorSpec spec{"x", DType::kFloat32, {-1, 4}};
  EXPECT_OK(CheckTensorAgainstSpec(Tensor(DType::kFloat32, {7, 4}), spec));
  Status wrong_dim = CheckTensorAgainstSpec(Tensor(DType::kFloat32, {7, 5}), spec);
  EXPECT_EQ(wrong_dim.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_dim.message().find("input 'x' has shape [7, 5], expected [-1, 4]"), std::string::npos);
  Status wrong_type = CheckTensorAgainstSpec(Tensor(DType::kInt64, {7, 4}), spec);
  EXPECT_NE(wrong_type.message().find("datatype INT64, expected FP32"), std::string::npos);
}

TEST(ModelSpec, JsonRoundTripAndCorruptionDetected) {
  ModelSpec spec;
  spec.inputs.push_back({"ids", DType::kInt64, {2, -1}});
  spec.outputs.push_back({"y", DType::kFloat16, {2}});
  auto back = ModelSpec::FromJson(spec.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->inputs[0].name, "ids");
  EXPECT_EQ(back->inputs[0].shape, (std::vector<int64_t>{2, -1}));
  EXPECT_EQ(back->outputs[0].dtype, DType::kFloat16);
  EXPECT_EQ(ModelSpec::FromJson("{\"inputs\": 3}").status().code(), StatusCode::kCorruption);
}

TEST(Hardware, FingerprintNamesMachineAndChangesWithTorch) {
  HardwareInfo hw = ProbeHardware();
  EXPECT_FALSE(hw.os.empty());
  EXPECT_FALSE(hw.arch.empty());
  EXPECT_GT(hw.cores, 0);
  std::string fp = Fingerprint(hw);
  EXPECT_EQ(fp.rfind(hw.os + "-" + hw.arch + "-" + hw.vector_isa + "-torch", 0), 0u) << fp;
  HardwareInfo other = hw;
  other.torch_version = "0.0.1";
  EXPECT_NE(Fingerprint(other), fp);
}

class BuildCacheTest : public ::testing::Test {
 protected:
  BuildKey key_{std::string(64, 'a'), "model", "cpu", "linux-x86_64-avx2-torch2-0"};
  TempDir dir_;
  BuildCache cache_{dir_.path()};

  std::string Stage() {
    auto s = cache_.NewStaging(key_);
    EXPECT_TRUE(s.ok());
    ModelSpec spec;
    spec.inputs.push_back({"x", DType::kFloat32, {-1, 2}});
    EXPECT_OK(fs::WriteFileAtomic(*s + "/model.so", "model bytes"));
    EXPECT_OK(fs::WriteFileAtomic(*s + "/spec.json", spec.ToJson()));
    EXPECT_OK(fs::WriteFileAtomic(*s + "/package.json", R"({"kind": "exported_program"})"));
    return *s;
  }
};

TEST_F(BuildCacheTest, CommitThenLookupFindsEntry) {
  EXPECT_EQ(cache_.Lookup(key_).status().code(), StatusCode::kNotFound);
  auto e = cache_.Commit(Stage(), key_);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto found = cache_.Lookup(key_);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->spec.inputs[0].name, "x");
  EXPECT_EQ(*fs::ReadFile(found->so_path), "model bytes");
  EXPECT_EQ(found->so_path, cache_.EntryDir(key_) + "/model.so");
  EXPECT_EQ(found->package_json, R"({"kind": "exported_program"})");
}

TEST_F(BuildCacheTest, TruncatedModelIsCorruptionAndRecommitReplacesIt) {
  ASSERT_TRUE(cache_.Commit(Stage(), key_).ok());
  ASSERT_OK(fs::WriteFileAtomic(cache_.EntryDir(key_) + "/model.so", "model"));
  auto found = cache_.Lookup(key_);
  EXPECT_EQ(found.status().code(), StatusCode::kCorruption);
  EXPECT_NE(found.status().message().find("model.so"), std::string::npos);
  auto listed = cache_.List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].status.code(), StatusCode::kCorruption);
  ASSERT_TRUE(cache_.Commit(Stage(), key_).ok());
  EXPECT_TRUE(cache_.Lookup(key_).ok());
}

TEST_F(BuildCacheTest, InductorOptionsMakeTheirOwnEntry) {
  BuildKey tuned = key_;
  tuned.options = R"({"max_autotune":true})";
  EXPECT_NE(cache_.EntryDir(tuned), cache_.EntryDir(key_));
  ASSERT_TRUE(cache_.Commit(Stage(), key_).ok());
  EXPECT_EQ(cache_.Lookup(tuned).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(cache_.Commit(Stage(), tuned).ok());
  auto listed = cache_.List();
  ASSERT_EQ(listed.size(), 2u);
  for (const auto& l : listed) {
    EXPECT_OK(l.status);
    EXPECT_EQ(l.key.fingerprint, key_.fingerprint);
    EXPECT_GT(l.bytes, 0);
  }
}

TEST_F(BuildCacheTest, EntryOfAnOlderLayoutIsRebuiltNotLoaded) {
  ASSERT_TRUE(cache_.Commit(Stage(), key_).ok());
  std::string manifest = *fs::ReadFile(cache_.EntryDir(key_) + "/manifest.json");
  manifest.replace(manifest.find("\"layout\": 2"), 11, "\"layout\": 1");
  ASSERT_OK(fs::WriteFileAtomic(cache_.EntryDir(key_) + "/manifest.json", manifest));
  auto found = cache_.Lookup(key_);
  EXPECT_EQ(found.status().code(), StatusCode::kCorruption);
  EXPECT_NE(found.status().message().find("older aotid"), std::string::npos) << found.status().message();
}

TEST_F(BuildCacheTest, StagingWithoutOutputsIsRefusedAndRemoved) {
  auto s = cache_.NewStaging(key_);
  ASSERT_TRUE(s.ok());
  auto e = cache_.Commit(*s, key_);
  EXPECT_FALSE(e.ok());
  EXPECT_FALSE(fs::Exists(*s));
  EXPECT_EQ(cache_.Lookup(key_).status().code(), StatusCode::kNotFound);
}

TEST_F(BuildCacheTest, KeysThatWouldEscapeTheCacheAreRefused) {
  BuildKey bad = key_;
  bad.artifact = "../../etc";
  EXPECT_EQ(cache_.Lookup(bad).status().code(), StatusCode::kInvalidArgument);
  bad = key_;
  bad.package_model = "../x";
  EXPECT_EQ(cache_.NewStaging(bad).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace aotid::runtime
