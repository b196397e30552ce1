#include <cstdlib>
#include <nlohmann/json.hpp>

#include "base/fs.h"
#include "base/json.h"
#include "sync/registry.h"

namespace aotid::sync {

StatusOr<Credentials> ReadCredentials(const std::string& file, const OciRef& ref) {
  std::string path = file;
  if (path.empty()) {
    const char* docker = std::getenv("DOCKER_CONFIG");
    std::string candidate =
        docker ? std::string(docker) + "/config.json" : fs::ExpandHome("~/.docker/config.json");
    if (!fs::Exists(candidate)) return Credentials{};
    path = candidate;
  }
  ASSIGN_OR_RETURN(std::string text, fs::ReadFile(path));
  nlohmann::json j = ParseJsonOrDiscarded(text);
  if (!j.is_object()) return InvalidArgument(path + " is not a JSON object");
  std::string host = ref.host + (ref.port ? ":" + std::to_string(ref.port) : "");
  if (!j.contains("auths") || !j["auths"].is_object()) return Credentials{};
  const nlohmann::json* entry = nullptr;
  for (const auto& [key, value] : j["auths"].items()) {
    std::string k = key;
    for (const char* scheme : {"https://", "http://"}) {
      if (k.starts_with(scheme)) k = k.substr(std::string_view(scheme).size());
    }
    if (k.ends_with("/")) k.pop_back();
    if (k == host && value.is_object()) entry = &value;
  }
  if (!entry) return Credentials{};
  Credentials c;
  if (entry->contains("username") && (*entry)["username"].is_string()) {
    c.user = (*entry)["username"];
    if (entry->contains("password") && (*entry)["password"].is_string()) c.password = (*entry)["password"];
    return c;
  }
  if (!entry->contains("auth") || !(*entry)["auth"].is_string())
    return InvalidArgument(path + ": the entry for " + host + " has neither auth nor username");
  std::string decoded;
  std::string in = (*entry)["auth"];
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : in) {
    int v = ch >= 'A' && ch <= 'Z'   ? ch - 'A'
            : ch >= 'a' && ch <= 'z' ? ch - 'a' + 26
            : ch >= '0' && ch <= '9' ? ch - '0' + 52
            : ch == '+'              ? 62
            : ch == '/'              ? 63
                                     : -1;
    if (v < 0) continue;  // '=' padding
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      decoded += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  size_t colon = decoded.find(':');
  if (colon == std::string::npos)
    return InvalidArgument(path + ": the auth for " + host + " is not base64 of user:password");
  c.user = decoded.substr(0, colon);
  c.password = decoded.substr(colon + 1);
  return c;
}

}  // namespace aotid::sync
