// How one version is served, and the one table that describes each of its
// settings.
//
// Every place that spells a setting (the store's columns, `aotid set`'s
// parsing and help, the diff recorded as an event, validation, `aotid show`,
// `aotid add`'s flags, the reconciler's work key) walks
// VersionSettingFields() instead. Adding a setting is a member of
// VersionSettings (its initializer is the default), a row in the table
// (version_settings.cc) and a schema migration adding its column with the
// same default (model_store.cc). A setting marked `live` takes effect
// without reloading the version, so LoadText leaves it out.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace aotid::storage {

class Stmt;

inline constexpr int kKeepAliveDefault = -1;  // the config's residency.keep_alive
inline constexpr int kKeepAliveAlways = -2;   // never unloaded (loaded at start, as before residency)
inline constexpr int kKeepAliveMax = 30 * 24 * 3600;

// "default", "always", "0", "90s", "5m", "2h": how `aotid set` takes and
// `show` prints keep_alive. "forever" and any negative integer (clients
// send -1 for forever) are "always" too. At most 30 days. InvalidArgument
// naming `key` and the text.
StatusOr<int> ParseKeepAlive(std::string_view key, std::string_view text);
// -1 "default", -2 "always", 0 "0", 300 "5m", 7200 "2h", 90 "90s": in the
// largest unit that divides it, so ParseKeepAlive reads it back.
std::string FormatKeepAlive(int seconds);

// Keys as `aotid set` and `aotid show` spell them; the table says more.
struct VersionSettings {
  std::string device = "auto";
  bool fallback_cpu = true;
  int num_runners = 1;
  int max_batch_size = 1;
  int max_batch_delay_us = 0;
  int threads = 0;
  // Limits of its runner; 0: the daemon's [runner] timeout_s and
  // memory_limit_mb.
  int timeout_s = 0;
  int memory_limit_mb = 0;
  // A language model's sequences at once; 0: as many as its cache holds.
  int max_sequences = 0;
  // Seconds without requests before the version is unloaded; 0: after each
  // answer. kKeepAliveDefault: the config's residency.keep_alive;
  // kKeepAliveAlways: never unloaded.
  int keep_alive_s = kKeepAliveDefault;
  // AOTInductor options for the build, as a JSON object with sorted keys
  // ("" = none). Part of the build's cache key.
  std::string inductor_options;

  bool operator==(const VersionSettings&) const = default;
};

enum class SettingType {
  kChoice,    // a string, one of `choices`
  kBool,      // true or false
  kInt,       // an integer from `min` to `max`
  kDuration,  // seconds from `min` to `max`, written as ParseKeepAlive takes them
  kOptions,   // a JSON object of scalars, set one option at a time as PREFIX<option>=VALUE
};

// One setting: one row of the table.
struct SettingField {
  std::string_view key;     // `aotid set` KEY (kOptions: `prefix` + option), JSON key of `show`, diff key
  std::string_view column;  // its column in the store's `versions` table
  SettingType type;
  // The member of VersionSettings it is, by type.
  std::string VersionSettings::*text = nullptr;  // kChoice, kOptions
  bool VersionSettings::*flag = nullptr;         // kBool
  int VersionSettings::*number = nullptr;        // kInt, kDuration
  std::vector<std::string_view> choices{};       // kChoice
  int64_t min = 0, max = 0;                      // kInt, kDuration
  std::string_view min_note{};                   // kInt: what `min` means, said in the range error
  std::string_view zero_text{};                  // kInt: how `show` prints 0 when 0 stands for something
  std::string_view prefix{};                     // kOptions: "inductor."
  std::string_view help{};                       // one line for `aotid set --help` and `aotid add --help`
  bool live = false;  // takes effect without reloading the version: left out of LoadText

  // The value's canonical text: "auto", "true", "8", `{"cpp.simdlen":8}`
  // ("{}" for no options). Equal texts mean equal values.
  std::string Text(const VersionSettings& s) const;
  // The default, as Text() writes it.
  std::string DefaultText() const { return Text(VersionSettings{}); }
  // KEY=VALUES as `aotid set --help` shows it: "num_runners=1..64".
  std::string Syntax() const;
  // Checks the value's range or allowed values; InvalidArgument naming the key.
  Status Validate(const VersionSettings& s) const;
  // Whether `aotid set` KEY names this setting.
  bool Matches(std::string_view set_key) const;
};

// Every setting, in the order `show`, the diff and the help list them.
std::span<const SettingField> VersionSettingFields();
// The setting that `aotid set` KEY names, or nullptr.
const SettingField* FindSettingField(std::string_view set_key);
// "device, fallback_cpu, ..., inductor.<option>": the keys `aotid set` takes.
std::string SettingKeyList();

// Applies one `aotid set` KEY=VALUE. Only the value's syntax is checked
// (ValidateSettings checks the whole afterwards); InvalidArgument for a key
// that is no setting or a value that does not parse.
Status ApplySetting(VersionSettings* s, std::string_view key, std::string_view value);
// Every field's range and allowed values, in table order: the first error.
Status ValidateSettings(const VersionSettings& s);

// A setting that differs between two settings, as the event log and `aotid
// set` print it: "num_runners 1 -> 2".
struct SettingChange {
  std::string key, from, to;
};
std::vector<SettingChange> DiffSettings(const VersionSettings& from, const VersionSettings& to);

// Every field as KEY=TEXT, space-separated, in table order: equal exactly
// when the settings are equal. Work and cache keys are made from it.
std::string CanonicalText(const VersionSettings& s);
// CanonicalText without the live fields: equal exactly when loading the
// version with either settings loads the same thing. The reconciler keys
// its load work on it, so changing keep_alive never reloads a model.
std::string LoadText(const VersionSettings& s);
// The settings line of `aotid show`: like CanonicalText, but with a value's
// meaning where it has one (threads=auto) and no options when there are none.
std::string DisplayText(const VersionSettings& s);
// The per-version part of `aotid set --help`: a line per setting, KEY=VALUES
// and what it is.
std::string SetHelp();

// The store's columns, in table order: "device, fallback_cpu, ..."; each
// prefixed with `table_alias` and a dot when one is given.
std::string SettingColumns(std::string_view table_alias = "");
// Binds every setting, in table order, from parameter `first` on; returns
// the next free parameter.
int BindSettings(Stmt* stmt, int first, const VersionSettings& s);
// Reads every setting, in table order, from column `first` on.
void ReadSettings(const Stmt& stmt, int first, VersionSettings* s);

// Values as `aotid set` takes them, also for the model's own settings:
// InvalidArgument "KEY must be an integer, got 'x'" and the like.
StatusOr<int64_t> ParseInt(std::string_view key, std::string_view text);
StatusOr<bool> ParseBool(std::string_view key, std::string_view text);

// `aotid set NAME inductor.cpp.simdlen=8`: the prefix of inductor options.
inline constexpr char kInductorPrefix[] = "inductor.";
// Option names are dotted identifiers (max_autotune, cpp.simdlen); values
// are JSON scalars. Whether torch knows the option is checked by the build.
Status ValidateInductorOption(std::string_view name, std::string_view json_value);
// Sets (or, with an empty value, removes) one option in a JSON object text,
// returning the new canonical text ("" when no option is left). A value that
// is not JSON is taken as a string.
StatusOr<std::string> SetInductorOption(const std::string& options, const std::string& name,
                                        const std::string& value);

}  // namespace aotid::storage
