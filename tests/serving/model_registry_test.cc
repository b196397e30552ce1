#include "serving/model_registry.h"

#include "test_util.h"

namespace aotid::serving {
namespace {

ServedModel Version(const std::string& name, int64_t v, ServeState state) {
  ServedModel m;
  m.name = name;
  m.version = v;
  m.state = state;
  return m;
}

TEST(ModelRegistry, RequestWithoutVersionGoesToTheNewestReadyOne) {
  ModelRegistry reg;
  EXPECT_EQ(reg.Find("m"), nullptr);
  reg.Put(Version("m", 1, ServeState::kReady));
  reg.Put(Version("m", 2, ServeState::kBuilding));
  EXPECT_EQ(reg.Find("m")->version, 1);
  reg.Put(Version("m", 2, ServeState::kReady));
  EXPECT_EQ(reg.Find("m")->version, 2);
  reg.Remove("m", 2);
  reg.Remove("m", 1);
  EXPECT_EQ(reg.Find("m"), nullptr);
  EXPECT_TRUE(reg.All()->empty());
}

TEST(ModelRegistry, ReaderKeepsItsSnapshotThroughAReplacement) {
  ModelRegistry reg;
  reg.Put(Version("m", 1, ServeState::kReady));
  auto held = reg.Find("m", 1);
  reg.Put(Version("m", 1, ServeState::kFailed));
  reg.Remove("m", 1);
  EXPECT_EQ(held->state, ServeState::kReady);  // a request in flight keeps what it started with
}

}  // namespace
}  // namespace aotid::serving
