#include "http/host.h"

#include <gtest/gtest.h>

namespace aotid::http {
namespace {

TEST(Host, LoopbackHostsAreRecognised) {
  for (std::string h : {"127.0.0.1", "127.255.0.9", "::1", "0:0:0:0:0:0:0:1", "localhost", "LocalHost"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  for (std::string h : {"0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "127.0.0.1.evil", "localhost.evil", "",
                        "127.0.0", "127.0.0.256", "127.0.0.1 ", "::2", "::ffff:10.0.0.1", "localhosx"}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
  EXPECT_EQ(HostWithoutPort("localhost:8765"), "localhost");
  EXPECT_EQ(HostWithoutPort("[::1]:8765"), "::1");
  EXPECT_EQ(HostWithoutPort("[::1]"), "::1");
  EXPECT_EQ(HostWithoutPort("example.com"), "example.com");
  // What follows the name must be a port, or the header names nothing.
  for (const char* bad : {"localhost:evil.com", "localhost:80@evil.com", "[::1]evil.com",
                          "localhost:8765 , evil.com", "localhost:", "[::1]:", "[::1", "localhost:123456"}) {
    EXPECT_EQ(HostWithoutPort(bad), "") << bad;
    EXPECT_FALSE(IsLoopbackHost(HostWithoutPort(bad))) << bad;
  }
}

}  // namespace
}  // namespace aotid::http
