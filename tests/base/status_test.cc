#include "base/status.h"

#include <set>
#include <string_view>

#include "test_util.h"

namespace aotid {
namespace {

TEST(Status, OkIsCheapAndErrorsCarryCodeAndMessage) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.ToString(), "OK");
  Status nf = NotFound("model 'x'");
  EXPECT_FALSE(nf.ok());
  EXPECT_EQ(nf.code(), StatusCode::kNotFound);
  EXPECT_EQ(nf.ToString(), "NotFound: model 'x'");
  EXPECT_EQ(nf.WithContext("ls").message(), "ls: model 'x'");
}

TEST(Status, EveryCodeHasItsOwnName) {
  std::set<std::string_view> names;
  for (int c = 0; c <= static_cast<int>(StatusCode::kLast); ++c) {
    std::string_view name = StatusCodeName(static_cast<StatusCode>(c));
    EXPECT_NE(name, "Unknown") << c;
    EXPECT_TRUE(names.insert(name).second) << name;
  }
  EXPECT_EQ(LimitExceeded("x").ToString(), "LimitExceeded: x");
}

TEST(StatusOr, HoldsValueOrError) {
  StatusOr<int> v = 7;
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 7);
  StatusOr<int> e = InvalidArgument("bad");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
}

TEST(StatusOr, BuiltFromAnOkStatusIsAnInternalErrorNotAnEmptySuccess) {
  StatusOr<int> v = Status::OK();
  EXPECT_FALSE(v.ok());
  // status() must agree with ok(): a caller that returns v.status() on
  // !ok() must not return OK with no value behind it.
  EXPECT_FALSE(v.status().ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
  EXPECT_EQ(v.status().message(), "StatusOr built from an OK status");
}

TEST(StatusOr, AssignOrReturnPassesOnTheInternalErrorOfAnOkStatus) {
  auto inner = []() -> StatusOr<int> { return Status::OK(); };
  auto outer = [&]() -> Status {
    ASSIGN_OR_RETURN(int x, inner());
    (void)x;
    return Status::OK();
  };
  EXPECT_EQ(outer().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace aotid
