#include "base/child_env.h"

#include <set>
#include <string_view>

extern char** environ;

namespace aotid {
namespace {

std::string_view NameOf(std::string_view entry) { return entry.substr(0, entry.find('=')); }

}  // namespace

std::vector<std::string> ChildEnvironment(const std::vector<std::string>& set) {
  std::set<std::string_view, std::less<>> replaced;
  for (const std::string& s : set) replaced.insert(NameOf(s));
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!replaced.contains(NameOf(*e))) env.emplace_back(*e);
  }
  env.insert(env.end(), set.begin(), set.end());
  return env;
}

std::vector<char*> NullTerminated(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace aotid
