#include "http/host.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

namespace aotid::http {

std::string HostWithoutPort(const std::string& host_header) {
  if (!host_header.empty() && host_header.front() == '[') {
    size_t close = host_header.find(']');
    return close == std::string::npos ? host_header : host_header.substr(1, close - 1);
  }
  size_t colon = host_header.find(':');
  if (colon != std::string::npos && host_header.find(':', colon + 1) == std::string::npos) {
    return host_header.substr(0, colon);
  }
  return host_header;
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
