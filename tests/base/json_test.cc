#include "base/json.h"

#include <gtest/gtest.h>

#include <string>

namespace aotid {
namespace {

std::string Nested(int depth, const std::string& inner = "") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

TEST(CheckJsonDepth, CountsContainersInsideContainersFromOne) {
  EXPECT_TRUE(CheckJsonDepth("1", 0).ok());
  EXPECT_TRUE(CheckJsonDepth(Nested(3), 3).ok());
  EXPECT_FALSE(CheckJsonDepth(Nested(4), 3).ok());
  EXPECT_TRUE(CheckJsonDepth(R"({"a": [1, {"b": []}], "c": {}})", 4).ok());
  EXPECT_FALSE(CheckJsonDepth(R"({"a": [1, {"b": []}], "c": {}})", 3).ok());
  // Siblings do not add up.
  EXPECT_TRUE(CheckJsonDepth("[[],[],[[]],[]]", 3).ok());
}

TEST(CheckJsonDepth, BracketsInsideStringsDoNotCount) {
  EXPECT_TRUE(CheckJsonDepth(R"(["[[[[{{{{"])", 1).ok());
  // An escaped quote does not end the string; an escaped backslash does
  // not escape the quote after it.
  EXPECT_TRUE(CheckJsonDepth(R"(["a\"[[[["])", 1).ok());
  EXPECT_FALSE(CheckJsonDepth(R"(["a\\", [[["]]]])", 3).ok());
}

TEST(CheckJsonDepth, NamesTheLimitAndThePlaceWhereItWasPassed) {
  Status s = CheckJsonDepth(R"({"x": [[[1]]]})", 3);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "nests deeper than 3 levels at byte 8 (near '{\"x\": [[[1]]]}')") << s.message();
}

TEST(ParseJson, ADocumentNested300000DeepIsRefusedBeforeItIsBuilt) {
  // Once parsed, copying this DOM recursed once a level and overflowed the
  // stack; building it took about 1.2 GB for 16 MiB.
  std::string bomb = Nested(300000);
  auto j = ParseJson(bomb, "the manifest", {.max_depth = 32});
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(j.status().message().find("the manifest nests deeper than 32 levels at byte 32"),
            std::string::npos)
      << j.status().message();
  EXPECT_TRUE(ParseJsonOrDiscarded(bomb).is_discarded());
}

TEST(ParseJson, ADocumentOfTooManyValuesIsRefusedBeforeItIsBuilt) {
  // 64 MiB of "{}," once made a 2.4 GB DOM that the daemon kept.
  std::string many = "[";
  for (int i = 0; i < 2000; ++i) many += "{},";
  many += "{}]";
  auto j = ParseJson(many, "the request body", {.max_values = 1000});
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("the request body holds more than 1000 values at byte"),
            std::string::npos)
      << j.status().message();
  EXPECT_TRUE(ParseJsonOrDiscarded(many, {.max_values = 1000}).is_discarded());
  // Commas and brackets inside strings are not values.
  std::string text = "[\"" + std::string(5000, ',') + std::string(5000, '[') + "\"]";
  EXPECT_TRUE(ParseJson(text, "x", {.max_values = 10}).ok());
  // 1, its 2002 arrays and objects and its 2000 commas: within 4003.
  EXPECT_TRUE(ParseJson(many, "x", {.max_values = 4003}).ok());
  EXPECT_FALSE(ParseJson(many, "x", {.max_values = 4002}).ok());
}

TEST(ParseJson, ADocumentOverItsSizeIsRefusedWithTheSizeAndTheLimit) {
  auto j = ParseJson(R"({"a": "0123456789"})", "extra/aotid.json", {.max_bytes = 8});
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().message(), "extra/aotid.json is 19 bytes, over the limit of 8");
  EXPECT_TRUE(ParseJsonOrDiscarded(R"({"a": "0123456789"})", {.max_bytes = 8}).is_discarded());
}

TEST(ParseJson, InvalidJsonIsRefusedWithTheByteAndTheReason) {
  auto j = ParseJson(R"({"a": [1, 2,]})", "the request body");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(j.status().message().find("the request body is not valid JSON at byte 12"), std::string::npos)
      << j.status().message();
  EXPECT_NE(j.status().message().find("unexpected ']'"), std::string::npos) << j.status().message();
  // Ill-formed UTF-8 is not JSON either.
  EXPECT_FALSE(ParseJson("[\"\xff\"]", "x").ok());
  EXPECT_TRUE(ParseJsonOrDiscarded("{").is_discarded());
}

TEST(ParseJson, AKeyTwiceInOneObjectIsRefusedNamingIt) {
  auto j =
      ParseJson(R"({"model": "a", "input": "x", "model": "b"})", "the request body", {.unique_keys = true});
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(j.status().message(), R"(the request body has the key "model" twice in one object)");
  // At any depth, and however the key is spelt: "\u0061" is "a".
  EXPECT_FALSE(ParseJson(R"([{"x": {"a": 1, "\u0061": 2}}])", "x", {.unique_keys = true}).ok());
  // A megabyte key is named by its first bytes, not cut inside a character.
  const std::string key = std::string(63, 'k') + "\xC3\xA9" + std::string(1 << 20, 'k');
  auto long_key = ParseJson("{\"" + key + "\": 1, \"" + key + "\": 2}", "x", {.unique_keys = true});
  ASSERT_FALSE(long_key.ok());
  EXPECT_EQ(long_key.status().message(),
            "x has the key \"" + std::string(63, 'k') + "\"... twice in one object");
  // The same key in different objects is no repeat.
  auto fine = ParseJson(R"({"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}], "c": {}})", "x", {.unique_keys = true});
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_EQ((*fine)["b"][1]["a"], 3);
  // Without unique_keys the last one is kept, as the parser does.
  auto last = ParseJson(R"({"model": "a", "model": "b"})", "x");
  ASSERT_TRUE(last.ok());
  EXPECT_EQ((*last)["model"], "b");
}

TEST(ParseJson, ADocumentWithinTheLimitsIsRead) {
  auto j = ParseJson(R"({"config": {"digest": "sha256:ab", "size": 7}, "layers": [[1, [2]]]})", "m",
                     {.max_depth = 4, .max_bytes = 100});
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)["config"]["size"], 7);
  EXPECT_EQ((*j)["layers"][0][1][0], 2);
  EXPECT_EQ(ParseJsonOrDiscarded("[1, 2]").size(), 2u);
}

}  // namespace
}  // namespace aotid
