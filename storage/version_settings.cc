#include "storage/version_settings.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <nlohmann/json.hpp>

#include "base/json.h"
#include "storage/sqlite.h"

namespace aotid::storage {
namespace {

// The table. Defaults are VersionSettings' member initializers; the column
// of a new row comes with a migration whose DEFAULT is the same value.
const std::vector<SettingField>& Table() {
  static const auto* table = new std::vector<SettingField>{
      {.key = "device",
       .column = "device",
       .type = SettingType::kChoice,
       .text = &VersionSettings::device,
       .choices = {"auto", "cpu", "mps", "cuda"},
       .help = "Where to run"},
      {.key = "fallback_cpu",
       .column = "fallback_cpu",
       .type = SettingType::kBool,
       .flag = &VersionSettings::fallback_cpu,
       .help = "Run on the CPU when the device cannot"},
      {.key = "num_runners",
       .column = "num_runners",
       .type = SettingType::kInt,
       .number = &VersionSettings::num_runners,
       .min = 1,
       .max = 64,
       .help = "Concurrent model instances"},
      {.key = "max_batch_size",
       .column = "max_batch_size",
       .type = SettingType::kInt,
       .number = &VersionSettings::max_batch_size,
       .min = 1,
       .max = 4096,
       .help = "Dynamic batching bound (1: off)"},
      {.key = "max_batch_delay_us",
       .column = "max_batch_delay_us",
       .type = SettingType::kInt,
       .number = &VersionSettings::max_batch_delay_us,
       .min = 0,
       .max = 1'000'000,
       .help = "Wait for a batch to fill, in microseconds"},
      {.key = "threads",
       .column = "threads",
       .type = SettingType::kInt,
       .number = &VersionSettings::threads,
       .min = 0,
       .max = 1024,
       .min_note = "one share of the cores per runner",
       .zero_text = "auto",
       .help = "CPU threads per runner (auto or 0: up to the cores shared among runners, timed once per "
               "build and machine; setting it again times it anew)"},
      {.key = "timeout_s",
       .column = "timeout_s",
       .type = SettingType::kInt,
       .number = &VersionSettings::timeout_s,
       .min = 0,
       .max = 24 * 3600,
       .min_note = "the daemon's runner.timeout_s",
       .zero_text = "default",
       .help = "A run longer than this many seconds gets 504 and a new runner (0: runner.timeout_s)"},
      {.key = "memory_limit_mb",
       .column = "memory_limit_mb",
       .type = SettingType::kInt,
       .number = &VersionSettings::memory_limit_mb,
       .min = 0,
       .max = 1 << 20,
       .min_note = "the daemon's runner.memory_limit_mb",
       .zero_text = "default",
       .help = "Memory its runner may allocate, in MiB (0: runner.memory_limit_mb)"},
      {.key = "max_sequences",
       .column = "max_sequences",
       .type = SettingType::kInt,
       .number = &VersionSettings::max_sequences,
       .min = 0,
       .max = 4096,
       .min_note = "as many as the model's cache holds",
       .zero_text = "auto",
       .help = "A language model's sequences decoded at once (auto or 0: as many as its cache holds)"},
      {.key = "keep_alive",
       .column = "keep_alive_s",
       .type = SettingType::kDuration,
       .number = &VersionSettings::keep_alive_s,
       .min = kKeepAliveAlways,
       .max = kKeepAliveMax,
       .help = "Unload after this long without requests (0: after each answer; always: never; default: "
               "residency.keep_alive)",
       .live = true},
      {.key = "inductor_options",
       .column = "inductor_options",
       .type = SettingType::kOptions,
       .text = &VersionSettings::inductor_options,
       .prefix = kInductorPrefix,
       .help = "AOTInductor build option (max_autotune, cpp.simdlen, ...)"},
  };
  return *table;
}

std::string Join(const std::vector<std::string_view>& items, std::string_view sep) {
  std::string out;
  for (auto item : items) out += (out.empty() ? "" : std::string(sep)) + std::string(item);
  return out;
}

// The options' name in `aotid show` and `aotid add`: the prefix without its dot.
std::string_view OptionsName(const SettingField& f) { return f.prefix.substr(0, f.prefix.size() - 1); }

}  // namespace

std::span<const SettingField> VersionSettingFields() { return Table(); }

std::string SettingField::Text(const VersionSettings& s) const {
  switch (type) {
    case SettingType::kChoice: return s.*text;
    case SettingType::kBool: return s.*flag ? "true" : "false";
    case SettingType::kInt: return std::to_string(s.*number);
    case SettingType::kDuration: return FormatKeepAlive(s.*number);
    case SettingType::kOptions: return (s.*text).empty() ? "{}" : s.*text;
  }
  return "";
}

std::string SettingField::Syntax() const {
  switch (type) {
    case SettingType::kChoice: return std::string(key) + "=" + Join(choices, "|");
    case SettingType::kBool: return std::string(key) + "=true|false";
    case SettingType::kInt:
      return std::string(key) + "=" + (zero_text.empty() ? "" : std::string(zero_text) + "|") +
             std::to_string(min) + ".." + std::to_string(max);
    case SettingType::kDuration: return std::string(key) + "=0|90s|5m|2h|always|default";
    case SettingType::kOptions: return std::string(prefix) + "<option>=VALUE";
  }
  return "";
}

bool SettingField::Matches(std::string_view set_key) const {
  return type == SettingType::kOptions ? set_key.starts_with(prefix) : set_key == key;
}

Status SettingField::Validate(const VersionSettings& s) const {
  switch (type) {
    case SettingType::kChoice:
      if (std::find(choices.begin(), choices.end(), s.*text) == choices.end()) {
        return InvalidArgument(std::string(key) + " '" + s.*text + "' is not one of " + Join(choices, ", "));
      }
      break;
    case SettingType::kBool: break;
    case SettingType::kInt:
      if (s.*number < min || s.*number > max) {
        return InvalidArgument(std::string(key) + " must be between " + std::to_string(min) +
                               (min_note.empty() ? "" : " (" + std::string(min_note) + ")") + " and " +
                               std::to_string(max) + ", got " + std::to_string(s.*number));
      }
      break;
    case SettingType::kDuration:
      // Only a value put in the store by other means gets here: `set`
      // parses durations within range.
      if (s.*number < min || s.*number > max) {
        return InvalidArgument(std::string(key) + " must be at most " +
                               FormatKeepAlive(static_cast<int>(max)) + ", always or default, got " +
                               std::to_string(s.*number) + " seconds");
      }
      break;
    case SettingType::kOptions: {
      const std::string& options = s.*text;
      if (options.empty()) break;
      auto j = ParseJsonOrDiscarded(options);
      if (j.is_discarded() || !j.is_object()) {
        return InvalidArgument(std::string(key) + " must be a JSON object, got '" + options + "'");
      }
      for (const auto& [k, v] : j.items()) RETURN_IF_ERROR(ValidateInductorOption(k, v.dump()));
      break;
    }
  }
  return Status::OK();
}

const SettingField* FindSettingField(std::string_view set_key) {
  for (const auto& f : Table()) {
    if (f.Matches(set_key)) return &f;
  }
  return nullptr;
}

std::string SettingKeyList() {
  std::string out;
  for (const auto& f : Table()) {
    std::string key =
        f.type == SettingType::kOptions ? std::string(f.prefix) + "<option>" : std::string(f.key);
    out += (out.empty() ? "" : ", ") + key;
  }
  return out;
}

StatusOr<int64_t> ParseInt(std::string_view key, std::string_view text) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty()) {
    return InvalidArgument(std::string(key) + " must be an integer, got '" + std::string(text) + "'");
  }
  return v;
}

StatusOr<bool> ParseBool(std::string_view key, std::string_view text) {
  // true or false, as the README and `set --help` say, in any case; not
  // yes/no/1/0, which once slipped through where TRUE did not.
  auto is = [&](std::string_view word) {
    return text.size() == word.size() &&
           std::equal(text.begin(), text.end(), word.begin(), [](char a, char b) { return (a | 0x20) == b; });
  };
  if (is("true")) return true;
  if (is("false")) return false;
  return InvalidArgument(std::string(key) + " must be true or false, got '" + std::string(text) + "'");
}

StatusOr<int> ParseKeepAlive(std::string_view key, std::string_view text) {
  auto bad = [&] {
    return InvalidArgument(std::string(key) +
                           " must be a duration (0, 90s, 5m, 2h), always or default, got '" +
                           std::string(text) + "'");
  };
  if (text == "default") return kKeepAliveDefault;
  if (text == "always" || text == "forever") return kKeepAliveAlways;
  auto digits = [](std::string_view t) {
    return !t.empty() && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  // A negative number is "forever" to the clients that send one (-1).
  if (text.starts_with('-') && digits(text.substr(1))) return kKeepAliveAlways;
  std::string_view number = text;
  int64_t unit = 1;
  if (!text.empty() && (text.back() == 's' || text.back() == 'm' || text.back() == 'h')) {
    unit = text.back() == 'h' ? 3600 : text.back() == 'm' ? 60 : 1;
    number.remove_suffix(1);
  }
  if (!digits(number)) return bad();
  // Past 30 days (or past int64) is too long, however many digits it has.
  int64_t n = 0;
  auto [p, ec] = std::from_chars(number.data(), number.data() + number.size(), n);
  if (ec != std::errc() || n > kKeepAliveMax / unit) {
    return InvalidArgument(std::string(key) + " must be at most " + FormatKeepAlive(kKeepAliveMax) +
                           " (30 days), got '" + std::string(text) + "'");
  }
  return static_cast<int>(n * unit);
}

std::string FormatKeepAlive(int seconds) {
  if (seconds == kKeepAliveDefault) return "default";
  if (seconds == kKeepAliveAlways) return "always";
  if (seconds <= 0) return std::to_string(seconds);  // 0, or a value no setting holds
  if (seconds % 3600 == 0) return std::to_string(seconds / 3600) + "h";
  if (seconds % 60 == 0) return std::to_string(seconds / 60) + "m";
  return std::to_string(seconds) + "s";
}

Status ApplySetting(VersionSettings* s, std::string_view key, std::string_view value) {
  const SettingField* f = FindSettingField(key);
  if (f == nullptr) {
    return InvalidArgument("unknown setting '" + std::string(key) + "'; known: " + SettingKeyList());
  }
  switch (f->type) {
    case SettingType::kChoice: s->*(f->text) = std::string(value); break;
    case SettingType::kBool: {
      ASSIGN_OR_RETURN(s->*(f->flag), ParseBool(key, value));
      break;
    }
    case SettingType::kInt: {
      // What `show` prints for 0 ("auto", "default") is taken back as 0.
      if (!f->zero_text.empty() && value == f->zero_text) {
        s->*(f->number) = 0;
        break;
      }
      ASSIGN_OR_RETURN(int64_t v, ParseInt(key, value));
      // Only what fits an int here; ValidateSettings checks the range, and
      // says it the same way for values too large for an int.
      if (v < 0 || v > 1'000'000'000) {
        return InvalidArgument(std::string(key) + " must be between " + std::to_string(f->min) +
                               (f->min_note.empty() ? "" : " (" + std::string(f->min_note) + ")") + " and " +
                               std::to_string(f->max) + ", got " + std::string(value));
      }
      s->*(f->number) = static_cast<int>(v);
      break;
    }
    case SettingType::kDuration: {
      ASSIGN_OR_RETURN(s->*(f->number), ParseKeepAlive(key, value));
      break;
    }
    case SettingType::kOptions: {
      std::string option(key.substr(f->prefix.size()));
      ASSIGN_OR_RETURN(s->*(f->text), SetInductorOption(s->*(f->text), option, std::string(value)));
      break;
    }
  }
  return Status::OK();
}

Status ValidateSettings(const VersionSettings& s) {
  for (const auto& f : Table()) RETURN_IF_ERROR(f.Validate(s));
  return Status::OK();
}

std::vector<SettingChange> DiffSettings(const VersionSettings& from, const VersionSettings& to) {
  std::vector<SettingChange> out;
  // 0 by its word where it has one, as `show` says it: "threads auto -> 2".
  auto said = [](const SettingField& f, std::string text) {
    return f.type == SettingType::kInt && text == "0" && !f.zero_text.empty() ? std::string(f.zero_text)
                                                                              : text;
  };
  for (const auto& f : Table()) {
    std::string a = f.Text(from), b = f.Text(to);
    if (a != b) out.push_back({std::string(f.key), said(f, std::move(a)), said(f, std::move(b))});
  }
  return out;
}

std::string CanonicalText(const VersionSettings& s) {
  std::string out;
  for (const auto& f : Table()) out += (out.empty() ? "" : " ") + std::string(f.key) + "=" + f.Text(s);
  return out;
}

std::string LoadText(const VersionSettings& s) {
  std::string out;
  for (const auto& f : Table()) {
    if (!f.live) out += (out.empty() ? "" : " ") + std::string(f.key) + "=" + f.Text(s);
  }
  return out;
}

std::string DisplayText(const VersionSettings& s) {
  std::string out;
  for (const auto& f : Table()) {
    std::string item;
    if (f.type == SettingType::kOptions) {
      if ((s.*f.text).empty()) continue;
      item = std::string(OptionsName(f)) + "=" + s.*f.text;
    } else if (f.type == SettingType::kInt && s.*f.number == 0 && !f.zero_text.empty()) {
      item = std::string(f.key) + "=" + std::string(f.zero_text);
    } else {
      item = std::string(f.key) + "=" + f.Text(s);
    }
    out += (out.empty() ? "" : " ") + item;
  }
  return out;
}

std::string SetHelp() {
  size_t width = 0;
  for (const auto& f : Table()) width = std::max(width, f.Syntax().size());
  std::string out;
  for (const auto& f : Table()) {
    std::string syntax = f.Syntax();
    std::string help(f.help);
    if (f.type == SettingType::kOptions) {
      help += "; an empty VALUE removes it";
    } else {
      // 0 by its word ("auto") where it has one.
      std::string def = f.DefaultText();
      help += "; default " + (def == "0" && !f.zero_text.empty() ? std::string(f.zero_text) : def);
    }
    out += "  " + syntax + std::string(width - syntax.size() + 2, ' ') + help + "\n";
  }
  return out;
}

std::string SettingColumns(std::string_view table_alias) {
  std::string out;
  for (const auto& f : Table()) {
    out += (out.empty() ? "" : ", ") + (table_alias.empty() ? "" : std::string(table_alias) + ".") +
           std::string(f.column);
  }
  return out;
}

int BindSettings(Stmt* stmt, int first, const VersionSettings& s) {
  int i = first;
  for (const auto& f : Table()) {
    switch (f.type) {
      case SettingType::kChoice:
      case SettingType::kOptions: stmt->Bind(i, s.*f.text); break;
      case SettingType::kBool: stmt->Bind(i, int64_t{s.*f.flag}); break;
      case SettingType::kInt:
      case SettingType::kDuration: stmt->Bind(i, int64_t{s.*f.number}); break;
    }
    ++i;
  }
  return i;
}

void ReadSettings(const Stmt& stmt, int first, VersionSettings* s) {
  int col = first;
  for (const auto& f : Table()) {
    switch (f.type) {
      case SettingType::kChoice:
      case SettingType::kOptions: s->*f.text = stmt.Text(col); break;
      case SettingType::kBool: s->*f.flag = stmt.Int(col) != 0; break;
      case SettingType::kInt:
      case SettingType::kDuration: s->*f.number = static_cast<int>(stmt.Int(col)); break;
    }
    ++col;
  }
}

Status ValidateInductorOption(std::string_view name, std::string_view json_value) {
  bool ok = !name.empty() && name.size() <= 128 && name.front() != '.' && name.back() != '.' &&
            name.find("..") == std::string_view::npos;
  for (char c : name) ok &= std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  if (!ok) {
    return InvalidArgument("inductor option '" + std::string(name) +
                           "' is not a dotted name like max_autotune or cpp.simdlen");
  }
  auto v = ParseJsonOrDiscarded(json_value);
  if (v.is_discarded() || v.is_structured()) {
    return InvalidArgument("inductor option " + std::string(name) +
                           " must be a number, true, false or a string");
  }
  return Status::OK();
}

StatusOr<std::string> SetInductorOption(const std::string& options, const std::string& name,
                                        const std::string& value) {
  nlohmann::json obj = nlohmann::json::object();
  if (!options.empty()) {
    obj = ParseJsonOrDiscarded(options);
    if (obj.is_discarded() || !obj.is_object()) {
      return InvalidArgument("stored inductor_options are not a JSON object");
    }
  }
  if (value.empty()) {
    obj.erase(name);
  } else {
    auto v = ParseJsonOrDiscarded(value);
    if (v.is_discarded()) v = value;  // a bare word is a string
    RETURN_IF_ERROR(ValidateInductorOption(name, v.dump()));
    obj[name] = v;
  }
  return obj.empty() ? std::string() : obj.dump();  // nlohmann orders keys: canonical
}

}  // namespace aotid::storage
