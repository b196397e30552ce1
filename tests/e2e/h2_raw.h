// HTTP/2 written and read by hand over a loopback socket, for tests that
// must send what no well-behaved client would: cut frames, lengths past any
// limit, floods. A frame is built from its fields; HEADERS carry HPACK
// literals (no Huffman, no indexing); a gRPC message is its 5-byte prefix
// and bytes. Frames read back are split into their fields, and header
// blocks the server sends are decoded (RFC 7541: the static and dynamic
// tables; a Huffman-coded string reads as "<huffman>", which the gRPC
// server does not send for the fields these tests read).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace aotid::testing::h2 {

enum FrameType : uint8_t {
  kData = 0,
  kHeaders = 1,
  kRstStream = 3,
  kSettings = 4,
  kPing = 6,
  kGoaway = 7,
  kWindowUpdate = 8,
};
constexpr uint8_t kEndStream = 0x1;
constexpr uint8_t kAck = 0x1;
constexpr uint8_t kEndHeaders = 0x4;

constexpr uint16_t kSettingsMaxConcurrentStreams = 3;
constexpr uint16_t kSettingsInitialWindowSize = 4;

constexpr uint32_t kRefusedStream = 0x7;
constexpr uint32_t kEnhanceYourCalm = 0xb;

inline constexpr std::string_view kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

struct Frame {
  uint32_t length = 0;
  uint8_t type = 0;
  uint8_t flags = 0;
  uint32_t stream = 0;
  std::string payload;

  // GOAWAY and RST_STREAM: the error code; GOAWAY: the last stream id.
  uint32_t ErrorCode() const;
  uint32_t LastStreamId() const;
  std::string GoawayDebug() const;
  // SETTINGS: the value of `id`, if sent.
  std::optional<uint32_t> Setting(uint16_t id) const;
};

// A frame as bytes. `length` overrides the header's length field (the
// payload is sent as given either way).
std::string MakeFrame(uint8_t type, uint8_t flags, uint32_t stream, std::string_view payload,
                      std::optional<uint32_t> length = std::nullopt);
std::string Settings(const std::vector<std::pair<uint16_t, uint32_t>>& values);
std::string WindowUpdate(uint32_t stream, uint32_t increment);
// HEADERS (END_HEADERS) opening a gRPC call to `path`.
std::string CallHeaders(uint32_t stream, std::string_view path, bool end_stream = false);
// A gRPC message: uncompressed flag, big-endian length, bytes. `length`
// overrides the declared length.
std::string GrpcMessage(std::string_view bytes, std::optional<uint32_t> length = std::nullopt);

// The decoder of the header blocks one connection sends.
class HpackDecoder {
 public:
  // Appends the fields of `block`; false when it is malformed.
  bool Decode(std::string_view block, std::vector<std::pair<std::string, std::string>>* out);

 private:
  bool Entry(uint64_t index, std::pair<std::string, std::string>* out) const;
  void Insert(std::pair<std::string, std::string> field);
  std::deque<std::pair<std::string, std::string>> table_;
  size_t size_ = 0;
  size_t max_ = 4096;
};

// A blocking client socket to 127.0.0.1:port.
class Conn {
 public:
  explicit Conn(int port, int rcvbuf = 0);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // Sends all of `data` within `timeout_ms`; false when the peer has gone
  // or the bytes would not go.
  bool Send(std::string_view data, int timeout_ms = 5000);
  // The next whole frame within `timeout_ms`; nullopt at EOF (closed() is
  // then true), on a reset, or when the time is up.
  std::optional<Frame> Read(int timeout_ms);
  // Reads and keeps frames until EOF or `timeout_ms`; true at EOF.
  bool ReadToClose(int timeout_ms, std::vector<Frame>* frames = nullptr);
  bool closed() const { return closed_; }
  // Shuts down and closes now; `reset`: with an RST (linger 0).
  void Close(bool reset = false);

 private:
  int fd_ = -1;
  std::string buf_;
  bool closed_ = false;
};

// The preface, an empty SETTINGS (or `settings`), and the ACK of the
// server's SETTINGS once it comes; the server's SETTINGS frame is returned
// (nullopt when none came within 5 s).
std::optional<Frame> Handshake(Conn& c, const std::string& settings = Settings({}));

}  // namespace aotid::testing::h2
