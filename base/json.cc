#include "base/json.h"

#include <algorithm>
#include <cstdint>
#include <unordered_set>
#include <vector>

namespace aotid {
namespace {

// Thrown out of the parser at the second of two equal keys in an object.
struct DuplicateKey {
  std::string key;
};

// A key for a message: as JSON, cut at about 64 bytes (a key may be
// megabytes), never inside a character.
std::string ShownKey(const std::string& key) {
  if (key.size() <= 64) return nlohmann::json(key).dump();
  size_t cut = 64;
  while (cut > 0 && (static_cast<unsigned char>(key[cut]) & 0xC0) == 0x80) --cut;
  return nlohmann::json(key.substr(0, cut)).dump() + "...";
}

// The DOM of `text`, refusing (by throwing DuplicateKey) an object with a
// key twice: the keys of each object being read are kept until it ends.
nlohmann::json ParseUniqueKeys(std::string_view text) {
  std::vector<std::unordered_set<std::string>> open;  // the innermost last
  auto check = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) open.emplace_back();
    if (event == Event::object_end) open.pop_back();
    if (event == Event::key && !open.back().insert(parsed.get<std::string>()).second)
      throw DuplicateKey{parsed.get<std::string>()};
    return true;
  };
  return nlohmann::json::parse(text.begin(), text.end(), check);
}

}  // namespace

std::string JsonPlace(std::string_view text, size_t at) {
  at = std::min(at, text.size());
  size_t from = at > 16 ? at - 16 : 0;
  std::string near(text.substr(from, std::min<size_t>(at - from + 16, text.size() - from)));
  for (char& c : near) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  }
  return "at byte " + std::to_string(at) + " (near '" + near + "')";
}

Status CheckJsonDepth(std::string_view text, int max_depth) { return CheckJsonShape(text, max_depth, 0); }

Status CheckJsonShape(std::string_view text, int max_depth, size_t max_values) {
  int depth = 0;
  size_t values = 1;
  const size_t limit = max_values == 0 ? SIZE_MAX : max_values;
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    char c = *p;
    if (c == '"') {
      // Skip the string: an escaped quote does not end it. An unterminated
      // string ends the scan; the parser reports it.
      for (++p; p < end && *p != '"'; ++p) {
        if (*p == '\\') ++p;
      }
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return InvalidArgument("nests deeper than " + std::to_string(max_depth) + " levels " +
                               JsonPlace(text, static_cast<size_t>(p - text.data())));
      }
      ++values;
    } else if (c == ']' || c == '}') {
      --depth;
    } else if (c == ',') {
      ++values;
    }
    if (values > limit) {
      return InvalidArgument("holds more than " + std::to_string(max_values) + " values " +
                             JsonPlace(text, static_cast<size_t>(p - text.data())));
    }
    ++p;
  }
  return Status::OK();
}

StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view what, const JsonLimits& limits) {
  auto refuse = [&](const std::string& why) {
    return InvalidArgument(std::string(what) + (what.empty() ? "" : " ") + why);
  };
  if (text.size() > limits.max_bytes) {
    return refuse("is " + std::to_string(text.size()) + " bytes, over the limit of " +
                  std::to_string(limits.max_bytes));
  }
  if (Status s = CheckJsonShape(text, limits.max_depth, limits.max_values); !s.ok())
    return refuse(s.message());
  try {
    return limits.unique_keys ? ParseUniqueKeys(text) : nlohmann::json::parse(text.begin(), text.end());
  } catch (const DuplicateKey& d) {
    return refuse("has the key " + ShownKey(d.key) + " twice in one object");
  } catch (const nlohmann::json::parse_error& e) {
    // The parser's reason without its own prefix and echo: "syntax error
    // while parsing value - invalid string: ill-formed UTF-8 byte".
    std::string why = e.what();
    if (size_t c = why.find("column "); c != std::string::npos && why.find(": ", c) != std::string::npos)
      why = why.substr(why.find(": ", c) + 2);
    if (size_t last = why.find("; last read"); last != std::string::npos) why.resize(last);
    return refuse("is not valid JSON " + JsonPlace(text, e.byte > 0 ? e.byte - 1 : 0) + ": " + why);
  } catch (const std::exception& e) {
    return refuse("is not valid JSON: " + JsonErrorReason(e));  // a number too large for a double, say
  }
}

std::string JsonErrorReason(const std::exception& e) {
  std::string why = e.what();
  if (size_t end = why.find("] "); why.starts_with("[json.exception.") && end != std::string::npos)
    why = why.substr(end + 2);
  if (why.size() > 200) why = why.substr(0, 200) + "...";
  return why;
}

nlohmann::json ParseJsonOrDiscarded(std::string_view text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes || !CheckJsonShape(text, limits.max_depth, limits.max_values).ok())
    return nlohmann::json(nlohmann::json::value_t::discarded);
  return nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

}  // namespace aotid
