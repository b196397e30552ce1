#include "storage/version_settings.h"

#include <map>

#include "storage/model_store.h"
#include "test_util.h"

namespace aotid::storage {
namespace {

using testing::TempDir;
using testing::TestData;

// A KEY=VALUE for `f` that `aotid set` takes and that differs from its default.
std::pair<std::string, std::string> OtherValue(const SettingField& f) {
  std::string def = f.DefaultText();
  switch (f.type) {
    case SettingType::kChoice:
      for (auto c : f.choices) {
        if (c != def) return {std::string(f.key), std::string(c)};
      }
      break;
    case SettingType::kBool: return {std::string(f.key), def == "true" ? "false" : "true"};
    case SettingType::kInt:
      return {std::string(f.key), std::to_string(def == std::to_string(f.min) ? f.max : f.min)};
    case SettingType::kDuration: return {std::string(f.key), def == "5m" ? "always" : "5m"};
    case SettingType::kOptions: return {std::string(f.prefix) + "max_autotune", "true"};
  }
  ADD_FAILURE() << f.key << " has no value besides its default";
  return {};
}

TEST(VersionSettings, SetHelpListsEveryKey) {
  std::string help = SetHelp();
  for (const auto& f : VersionSettingFields()) {
    std::string key =
        f.type == SettingType::kOptions ? std::string(f.prefix) + "<option>" : std::string(f.key);
    EXPECT_NE(help.find("  " + key + "="), std::string::npos) << key << " missing from:\n" << help;
    EXPECT_NE(help.find(f.Syntax()), std::string::npos) << f.Syntax() << " missing from:\n" << help;
    EXPECT_NE(help.find(f.help), std::string::npos) << f.help << " missing from:\n" << help;
  }
  EXPECT_NE(help.find("threads=auto|0..1024"), std::string::npos) << help;
  EXPECT_NE(help.find("; default auto"), std::string::npos) << help;
  EXPECT_NE(help.find("inductor.<option>=VALUE"), std::string::npos) << help;
  EXPECT_NE(help.find("device=auto|cpu|mps|cuda"), std::string::npos) << help;
  EXPECT_NE(help.find("keep_alive=0|90s|5m|2h|always|default"), std::string::npos) << help;
}

TEST(VersionSettings, UnknownKeyErrorListsEveryKey) {
  VersionSettings s;
  Status st = ApplySetting(&s, "colour", "blue");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "unknown setting 'colour'; known: device, fallback_cpu, num_runners, max_batch_size, "
            "max_batch_delay_us, threads, timeout_s, memory_limit_mb, max_sequences, keep_alive, "
            "inductor.<option>");
  EXPECT_EQ(s, VersionSettings{});
}

// The work key is made from CanonicalText: a field it left out would let a
// changed setting go unnoticed by the reconciler.
TEST(VersionSettings, CanonicalTextAndDiffSeeEveryField) {
  VersionSettings base;
  for (const auto& f : VersionSettingFields()) {
    SCOPED_TRACE(std::string(f.key));
    VersionSettings changed = base;
    auto [key, value] = OtherValue(f);
    ASSERT_OK(ApplySetting(&changed, key, value));
    ASSERT_OK(ValidateSettings(changed));
    EXPECT_FALSE(changed == base);
    EXPECT_NE(CanonicalText(changed), CanonicalText(base));
    auto diff = DiffSettings(base, changed);
    ASSERT_EQ(diff.size(), 1u);
    EXPECT_EQ(diff[0].key, f.key);
    // 0 is said by its word where it has one ("threads auto -> 1024").
    EXPECT_EQ(diff[0].from,
              f.DefaultText() == "0" && !f.zero_text.empty() ? std::string(f.zero_text) : f.DefaultText());
    EXPECT_EQ(diff[0].to, f.Text(changed));
  }
  EXPECT_TRUE(DiffSettings(base, base).empty());
  EXPECT_EQ(CanonicalText(base),
            "device=auto fallback_cpu=true num_runners=1 max_batch_size=1 max_batch_delay_us=0 threads=0 "
            "timeout_s=0 memory_limit_mb=0 max_sequences=0 keep_alive=default inductor_options={}");
}

// The reconciler keys its load work on LoadText: a live setting (keep_alive)
// changed must not reload the version, and any other must.
TEST(VersionSettings, LoadTextLeavesOutExactlyTheLiveFields) {
  VersionSettings base;
  int live = 0;
  for (const auto& f : VersionSettingFields()) {
    SCOPED_TRACE(std::string(f.key));
    VersionSettings changed = base;
    auto [key, value] = OtherValue(f);
    ASSERT_OK(ApplySetting(&changed, key, value));
    EXPECT_EQ(LoadText(changed) == LoadText(base), f.live);
    EXPECT_EQ(LoadText(changed).find(std::string(f.key) + "=") == std::string::npos, f.live);
    live += f.live;
  }
  EXPECT_EQ(live, 1);
  EXPECT_TRUE(FindSettingField("keep_alive")->live);
  EXPECT_EQ(LoadText(base),
            "device=auto fallback_cpu=true num_runners=1 max_batch_size=1 max_batch_delay_us=0 threads=0 "
            "timeout_s=0 memory_limit_mb=0 max_sequences=0 inductor_options={}");
}

// keep_alive as `aotid set` takes it and `show` prints it: the words, a
// number of seconds, or a number and its unit; printed in the largest unit
// that divides it, and read back the same.
TEST(VersionSettings, KeepAliveIsADurationAlwaysOrDefault) {
  struct Case {
    const char* text;
    int seconds;
    const char* shown;
  } cases[] = {
      {"default", kKeepAliveDefault, "default"},
      {"always", kKeepAliveAlways, "always"},
      {"forever", kKeepAliveAlways, "always"},
      {"-1", kKeepAliveAlways, "always"},  // clients send -1 for forever
      {"-300", kKeepAliveAlways, "always"},
      {"0", 0, "0"},
      {"0s", 0, "0"},
      {"90", 90, "90s"},
      {"90s", 90, "90s"},
      {"120s", 120, "2m"},
      {"5m", 300, "5m"},
      {"90m", 5400, "90m"},
      {"2h", 7200, "2h"},
      {"720h", 30 * 24 * 3600, "720h"},
      {"2592000", 30 * 24 * 3600, "720h"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    auto seconds = ParseKeepAlive("keep_alive", c.text);
    ASSERT_TRUE(seconds.ok()) << seconds.status().ToString();
    EXPECT_EQ(*seconds, c.seconds);
    EXPECT_EQ(FormatKeepAlive(c.seconds), c.shown);
    EXPECT_EQ(*ParseKeepAlive("keep_alive", c.shown), c.seconds);
  }
  for (const char* bad : {"", "soon", "5 m", "m", "5d", "1h30m", "5M", "1.5h", "+5", "-", "-5m", "s5"}) {
    auto r = ParseKeepAlive("keep_alive", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(
        r.status().message(),
        "keep_alive must be a duration (0, 90s, 5m, 2h), always or default, got '" + std::string(bad) + "'");
  }
  for (const char* too_long : {"721h", "43201m", "2592001", "99999999999999999999999"}) {
    auto r = ParseKeepAlive("keep_alive", too_long);
    EXPECT_EQ(r.status().message(),
              "keep_alive must be at most 720h (30 days), got '" + std::string(too_long) + "'");
  }

  VersionSettings s;
  ASSERT_OK(ApplySetting(&s, "keep_alive", "5m"));
  EXPECT_EQ(s.keep_alive_s, 300);
  EXPECT_EQ(ApplySetting(&s, "keep_alive", "soon").message(),
            "keep_alive must be a duration (0, 90s, 5m, 2h), always or default, got 'soon'");
  EXPECT_EQ(s.keep_alive_s, 300);
  auto diff = DiffSettings(VersionSettings{}, s);
  ASSERT_EQ(diff.size(), 1u);
  EXPECT_EQ(diff[0].key + " " + diff[0].from + " -> " + diff[0].to, "keep_alive default -> 5m");
  s.keep_alive_s = -3;  // only a store written by other means holds this
  EXPECT_EQ(ValidateSettings(s).message(),
            "keep_alive must be at most 720h, always or default, got -3 seconds");
}

TEST(VersionSettings, ValuesAreParsedByTypeAndCheckedByRange) {
  VersionSettings s;
  ASSERT_OK(ApplySetting(&s, "device", "cpu"));
  ASSERT_OK(ApplySetting(&s, "fallback_cpu", "false"));
  ASSERT_OK(ApplySetting(&s, "num_runners", "3"));
  ASSERT_OK(ApplySetting(&s, "inductor.cpp.simdlen", "8"));
  ASSERT_OK(ApplySetting(&s, "inductor.freezing", "true"));
  EXPECT_EQ(s.device, "cpu");
  EXPECT_FALSE(s.fallback_cpu);
  EXPECT_EQ(s.num_runners, 3);
  EXPECT_EQ(s.inductor_options, R"({"cpp.simdlen":8,"freezing":true})");
  ASSERT_OK(ApplySetting(&s, "inductor.freezing", ""));
  EXPECT_EQ(s.inductor_options, R"({"cpp.simdlen":8})");

  EXPECT_EQ(ApplySetting(&s, "num_runners", "two").message(), "num_runners must be an integer, got 'two'");
  EXPECT_EQ(ApplySetting(&s, "threads", "-1").message(),
            "threads must be between 0 (one share of the cores per runner) and 1024, got -1");
  EXPECT_EQ(ApplySetting(&s, "fallback_cpu", "maybe").message(),
            "fallback_cpu must be true or false, got 'maybe'");
  for (const char* other : {"yes", "no", "1", "0", "on"}) {  // only what the docs say
    EXPECT_FALSE(ApplySetting(&s, "fallback_cpu", other).ok()) << other;
  }
  ASSERT_OK(ApplySetting(&s, "fallback_cpu", "TRUE"));
  EXPECT_TRUE(s.fallback_cpu);
  EXPECT_NE(ApplySetting(&s, "inductor.cpp..simdlen", "8").message().find("is not a dotted name"),
            std::string::npos);

  auto invalid = [](void (*change)(VersionSettings*)) {
    VersionSettings v;
    change(&v);
    return ValidateSettings(v).message();
  };
  EXPECT_EQ(invalid([](VersionSettings* v) { v->device = "tpu"; }),
            "device 'tpu' is not one of auto, cpu, mps, cuda");
  EXPECT_EQ(invalid([](VersionSettings* v) { v->num_runners = 0; }),
            "num_runners must be between 1 and 64, got 0");
  EXPECT_EQ(invalid([](VersionSettings* v) { v->max_batch_size = 4097; }),
            "max_batch_size must be between 1 and 4096, got 4097");
  EXPECT_EQ(invalid([](VersionSettings* v) { v->max_batch_delay_us = 1'000'001; }),
            "max_batch_delay_us must be between 0 and 1000000, got 1000001");
  EXPECT_EQ(invalid([](VersionSettings* v) { v->threads = 1025; }),
            "threads must be between 0 (one share of the cores per runner) and 1024, got 1025");
  EXPECT_EQ(invalid([](VersionSettings* v) { v->timeout_s = 86401; }),
            "timeout_s must be between 0 (the daemon's runner.timeout_s) and 86400, got 86401");
  EXPECT_EQ(invalid([](VersionSettings* v) { v->memory_limit_mb = -1; }),
            "memory_limit_mb must be between 0 (the daemon's runner.memory_limit_mb) and 1048576, got -1");
  EXPECT_EQ(invalid([](VersionSettings* v) { v->inductor_options = "[1]"; }),
            "inductor_options must be a JSON object, got '[1]'");
}

// What `show` prints for 0 is taken back by `set`: threads=auto,
// timeout_s=default.
TEST(VersionSettings, TheWordsShowPrintsForZeroAreAccepted) {
  VersionSettings s;
  s.threads = 3;
  s.timeout_s = 9;
  ASSERT_OK(ApplySetting(&s, "threads", "auto"));
  ASSERT_OK(ApplySetting(&s, "timeout_s", "default"));
  EXPECT_EQ(s.threads, 0);
  EXPECT_EQ(s.timeout_s, 0);
  Status wrong = ApplySetting(&s, "threads", "default");
  EXPECT_EQ(wrong.message(), "threads must be an integer, got 'default'");
}

TEST(VersionSettings, DisplayTextSaysAutoThreadsAndLeavesOutNoOptions) {
  VersionSettings s;
  EXPECT_EQ(DisplayText(s),
            "device=auto fallback_cpu=true num_runners=1 max_batch_size=1 max_batch_delay_us=0 threads=auto "
            "timeout_s=default memory_limit_mb=default max_sequences=auto keep_alive=default");
  s.threads = 2;
  s.timeout_s = 5;
  s.keep_alive_s = 300;
  s.inductor_options = R"({"cpp.simdlen":8})";
  EXPECT_EQ(DisplayText(s),
            "device=auto fallback_cpu=true num_runners=1 max_batch_size=1 max_batch_delay_us=0 "
            R"(threads=2 timeout_s=5 memory_limit_mb=default max_sequences=auto keep_alive=5m )"
            R"(inductor={"cpp.simdlen":8})");
}

// Each field has its column in a fresh store, with the struct's default as
// the column's DEFAULT: a row without its migration fails here.
TEST(VersionSettings, EveryFieldHasAColumnWithTheSameDefault) {
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto db = Db::Open(d / "aotid.db", /*create=*/false);  // the store's file, read as it is
  ASSERT_TRUE(db.ok()) << db.status().ToString();
  auto info = (*db)->Prepare("SELECT name, dflt_value FROM pragma_table_info('versions')");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  std::map<std::string, std::string> defaults;
  ASSERT_OK(info->ForEachRow([&](const Stmt& row) { defaults[row.Text(0)] = row.Text(1); }));
  VersionSettings def;
  for (const auto& f : VersionSettingFields()) {
    SCOPED_TRACE(std::string(f.key));
    auto it = defaults.find(std::string(f.column));
    ASSERT_NE(it, defaults.end()) << "no column " << f.column;
    std::string want = f.type == SettingType::kBool ? (def.*f.flag ? "1" : "0")
                       : f.number != nullptr        ? std::to_string(def.*f.number)
                                                    : "'" + def.*f.text + "'";
    EXPECT_EQ(it->second, want);
  }
}

// Every field goes into the store and comes back, through add and set.
TEST(VersionSettings, EveryFieldRoundTripsThroughTheStore) {
  TempDir d;
  auto store = ModelStore::Open(d.path());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  AddRequest req;
  req.file = TestData("mlp.pt2");
  req.name = "mlp";
  for (const auto& f : VersionSettingFields()) {
    auto [key, value] = OtherValue(f);
    ASSERT_OK(ApplySetting(&req.settings, key, value));
  }
  auto added = (*store)->Add(req);
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  auto model = (*store)->GetModel("mlp");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(model->versions.at(0).settings, req.settings);

  std::vector<std::pair<std::string, std::string>> back;  // every field to its default again
  VersionSettings def;
  for (const auto& f : VersionSettingFields()) {
    if (f.type == SettingType::kOptions) {
      back.emplace_back(std::string(f.prefix) + "max_autotune", "");
    } else {
      back.emplace_back(std::string(f.key), f.DefaultText());
    }
  }
  auto changes = (*store)->Set("mlp", 1, back);
  ASSERT_TRUE(changes.ok()) << changes.status().ToString();
  EXPECT_EQ(changes->size(), VersionSettingFields().size());
  model = (*store)->GetModel("mlp");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->versions.at(0).settings, def);
}

}  // namespace
}  // namespace aotid::storage
