#include "http/host.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <string_view>

namespace aotid::http {

namespace {

// A port as a Host header may carry it: 1 to 5 digits.
bool IsPort(std::string_view p) {
  if (p.empty() || p.size() > 5) return false;
  for (char c : p) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

std::string HostWithoutPort(const std::string& host_header) {
  std::string_view h = host_header;
  if (!h.empty() && h.front() == '[') {
    size_t close = h.find(']');
    if (close == std::string_view::npos) return "";
    std::string_view rest = h.substr(close + 1);
    if (!rest.empty() && !(rest.front() == ':' && IsPort(rest.substr(1)))) return "";
    return std::string(h.substr(1, close - 1));
  }
  size_t colon = h.find(':');
  if (colon == std::string_view::npos) return host_header;
  if (h.find(':', colon + 1) != std::string_view::npos) return host_header;  // a bare IPv6 address
  if (!IsPort(h.substr(colon + 1))) return "";
  return std::string(h.substr(0, colon));
}

bool IsLoopbackHost(const std::string& host) {
  if (host.size() == 9) {  // "localhost" in any case
    bool same = true;
    for (size_t i = 0; i < 9 && same; ++i) same = (host[i] | 0x20) == "localhost"[i];
    if (same) return true;
  }
  in_addr v4;
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && std::memcmp(&v6, &in6addr_loopback, sizeof v6) == 0;
}

}  // namespace aotid::http
