#include "e2e/h2_raw.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "base/fd.h"

namespace aotid::testing::h2 {
namespace {

void Put32(std::string* out, uint32_t v) {
  out->push_back(static_cast<char>(v >> 24));
  out->push_back(static_cast<char>(v >> 16));
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v));
}

uint32_t Get32(std::string_view s, size_t at) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(s[at + i])); };
  return b(0) << 24 | b(1) << 16 | b(2) << 8 | b(3);
}

// An HPACK integer with an N-bit prefix, the first byte's high bits `high`.
void PutInt(std::string* out, uint8_t high, int prefix_bits, uint64_t v) {
  const uint64_t max = (uint64_t{1} << prefix_bits) - 1;
  if (v < max) {
    out->push_back(static_cast<char>(high | v));
    return;
  }
  out->push_back(static_cast<char>(high | max));
  v -= max;
  while (v >= 128) {
    out->push_back(static_cast<char>(0x80 | (v & 0x7f)));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

bool GetInt(std::string_view s, size_t* at, int prefix_bits, uint64_t* v) {
  if (*at >= s.size()) return false;
  const uint64_t max = (uint64_t{1} << prefix_bits) - 1;
  *v = static_cast<uint8_t>(s[(*at)++]) & max;
  if (*v < max) return true;
  for (int shift = 0; shift < 56; shift += 7) {
    if (*at >= s.size()) return false;
    uint8_t b = static_cast<uint8_t>(s[(*at)++]);
    *v += static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

bool GetString(std::string_view s, size_t* at, std::string* out) {
  if (*at >= s.size()) return false;
  bool huffman = static_cast<uint8_t>(s[*at]) & 0x80;
  uint64_t n;
  if (!GetInt(s, at, 7, &n) || n > s.size() - *at) return false;
  *out = huffman ? "<huffman>" : std::string(s.substr(*at, n));
  *at += n;
  return true;
}

void PutLiteral(std::string* out, std::string_view name, std::string_view value) {
  out->push_back(0);  // literal without indexing, new name
  PutInt(out, 0, 7, name.size());
  out->append(name);
  PutInt(out, 0, 7, value.size());
  out->append(value);
}

// RFC 7541, Appendix A.
const std::pair<const char*, const char*> kStatic[] = {
    {":authority", ""},
    {":method", "GET"},
    {":method", "POST"},
    {":path", "/"},
    {":path", "/index.html"},
    {":scheme", "http"},
    {":scheme", "https"},
    {":status", "200"},
    {":status", "204"},
    {":status", "206"},
    {":status", "304"},
    {":status", "400"},
    {":status", "404"},
    {":status", "500"},
    {"accept-charset", ""},
    {"accept-encoding", "gzip, deflate"},
    {"accept-language", ""},
    {"accept-ranges", ""},
    {"accept", ""},
    {"access-control-allow-origin", ""},
    {"age", ""},
    {"allow", ""},
    {"authorization", ""},
    {"cache-control", ""},
    {"content-disposition", ""},
    {"content-encoding", ""},
    {"content-language", ""},
    {"content-length", ""},
    {"content-location", ""},
    {"content-range", ""},
    {"content-type", ""},
    {"cookie", ""},
    {"date", ""},
    {"etag", ""},
    {"expect", ""},
    {"expires", ""},
    {"from", ""},
    {"host", ""},
    {"if-match", ""},
    {"if-modified-since", ""},
    {"if-none-match", ""},
    {"if-range", ""},
    {"if-unmodified-since", ""},
    {"last-modified", ""},
    {"link", ""},
    {"location", ""},
    {"max-forwards", ""},
    {"proxy-authenticate", ""},
    {"proxy-authorization", ""},
    {"range", ""},
    {"referer", ""},
    {"refresh", ""},
    {"retry-after", ""},
    {"server", ""},
    {"set-cookie", ""},
    {"strict-transport-security", ""},
    {"transfer-encoding", ""},
    {"user-agent", ""},
    {"vary", ""},
    {"via", ""},
    {"www-authenticate", ""},
};
constexpr uint64_t kStaticSize = sizeof kStatic / sizeof kStatic[0];

}  // namespace

uint32_t Frame::ErrorCode() const {
  if (type == kRstStream && payload.size() >= 4) return Get32(payload, 0);
  if (type == kGoaway && payload.size() >= 8) return Get32(payload, 4);
  return 0;
}

uint32_t Frame::LastStreamId() const {
  return type == kGoaway && payload.size() >= 4 ? Get32(payload, 0) & 0x7fffffff : 0;
}

std::string Frame::GoawayDebug() const {
  return type == kGoaway && payload.size() > 8 ? payload.substr(8) : "";
}

std::optional<uint32_t> Frame::Setting(uint16_t id) const {
  if (type != kSettings) return std::nullopt;
  for (size_t at = 0; at + 6 <= payload.size(); at += 6) {
    uint16_t got =
        static_cast<uint16_t>(static_cast<uint8_t>(payload[at]) << 8 | static_cast<uint8_t>(payload[at + 1]));
    if (got == id) return Get32(payload, at + 2);
  }
  return std::nullopt;
}

std::string MakeFrame(uint8_t type, uint8_t flags, uint32_t stream, std::string_view payload,
                      std::optional<uint32_t> length) {
  uint32_t n = length.value_or(static_cast<uint32_t>(payload.size()));
  std::string out;
  out.push_back(static_cast<char>(n >> 16));
  out.push_back(static_cast<char>(n >> 8));
  out.push_back(static_cast<char>(n));
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(flags));
  Put32(&out, stream & 0x7fffffff);
  out.append(payload);
  return out;
}

std::string Settings(const std::vector<std::pair<uint16_t, uint32_t>>& values) {
  std::string payload;
  for (const auto& [id, v] : values) {
    payload.push_back(static_cast<char>(id >> 8));
    payload.push_back(static_cast<char>(id));
    Put32(&payload, v);
  }
  return MakeFrame(kSettings, 0, 0, payload);
}

std::string WindowUpdate(uint32_t stream, uint32_t increment) {
  std::string payload;
  Put32(&payload, increment & 0x7fffffff);
  return MakeFrame(kWindowUpdate, 0, stream, payload);
}

std::string CallHeaders(uint32_t stream, std::string_view path, bool end_stream) {
  std::string block;
  PutLiteral(&block, ":method", "POST");
  PutLiteral(&block, ":scheme", "http");
  PutLiteral(&block, ":path", path);
  PutLiteral(&block, ":authority", "127.0.0.1");
  PutLiteral(&block, "content-type", "application/grpc");
  PutLiteral(&block, "te", "trailers");
  return MakeFrame(kHeaders, kEndHeaders | (end_stream ? kEndStream : 0), stream, block);
}

std::string GrpcMessage(std::string_view bytes, std::optional<uint32_t> length) {
  std::string out(1, '\0');
  Put32(&out, length.value_or(static_cast<uint32_t>(bytes.size())));
  out.append(bytes);
  return out;
}

bool HpackDecoder::Entry(uint64_t index, std::pair<std::string, std::string>* out) const {
  if (index == 0) return false;
  if (index <= kStaticSize) {
    *out = {kStatic[index - 1].first, kStatic[index - 1].second};
    return true;
  }
  index -= kStaticSize + 1;
  if (index >= table_.size()) return false;
  *out = table_[index];
  return true;
}

void HpackDecoder::Insert(std::pair<std::string, std::string> field) {
  size_t n = field.first.size() + field.second.size() + 32;
  table_.push_front(std::move(field));
  size_ += n;
  while (size_ > max_ && !table_.empty()) {
    size_ -= table_.back().first.size() + table_.back().second.size() + 32;
    table_.pop_back();
  }
}

bool HpackDecoder::Decode(std::string_view block, std::vector<std::pair<std::string, std::string>>* out) {
  size_t at = 0;
  while (at < block.size()) {
    uint8_t b = static_cast<uint8_t>(block[at]);
    uint64_t index;
    std::pair<std::string, std::string> field;
    if (b & 0x80) {  // indexed
      if (!GetInt(block, &at, 7, &index) || !Entry(index, &field)) return false;
      out->push_back(field);
      continue;
    }
    if ((b & 0xe0) == 0x20) {  // dynamic table size update
      if (!GetInt(block, &at, 5, &index)) return false;
      max_ = index;
      while (size_ > max_ && !table_.empty()) {
        size_ -= table_.back().first.size() + table_.back().second.size() + 32;
        table_.pop_back();
      }
      continue;
    }
    const bool incremental = (b & 0xc0) == 0x40;
    if (!GetInt(block, &at, incremental ? 6 : 4, &index)) return false;
    if (index == 0) {
      if (!GetString(block, &at, &field.first)) return false;
    } else {
      if (!Entry(index, &field)) return false;
    }
    if (!GetString(block, &at, &field.second)) return false;
    out->push_back(field);
    if (incremental) Insert(field);
  }
  return true;
}

Conn::Conn(int port, int rcvbuf) {
  fd_ = fd::Socket(AF_INET, SOCK_STREAM);
  if (fd_ < 0) return;
  if (rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

Conn::~Conn() { Close(); }

void Conn::Close(bool reset) {
  if (fd_ < 0) return;
  if (reset) {
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  } else {
    ::shutdown(fd_, SHUT_RDWR);
  }
  ::close(fd_);
  fd_ = -1;
}

bool Conn::Send(std::string_view data, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!data.empty()) {
    if (fd_ < 0) return false;
    ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
  }
  return true;
}

std::optional<Frame> Conn::Read(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (buf_.size() >= 9) {
      uint32_t n = static_cast<uint32_t>(static_cast<uint8_t>(buf_[0])) << 16 |
                   static_cast<uint32_t>(static_cast<uint8_t>(buf_[1])) << 8 | static_cast<uint8_t>(buf_[2]);
      if (buf_.size() >= 9 + n) {
        Frame f;
        f.length = n;
        f.type = static_cast<uint8_t>(buf_[3]);
        f.flags = static_cast<uint8_t>(buf_[4]);
        f.stream = Get32(buf_, 5) & 0x7fffffff;
        f.payload = buf_.substr(9, n);
        buf_.erase(0, 9 + n);
        return f;
      }
    }
    if (fd_ < 0 || closed_) return std::nullopt;
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char chunk[65536];
    ssize_t got = ::recv(fd_, chunk, sizeof chunk, 0);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
      closed_ = true;
      continue;  // whole frames left in the buffer are still read
    }
    if (got > 0) buf_.append(chunk, static_cast<size_t>(got));
  }
}

bool Conn::ReadToClose(int timeout_ms, std::vector<Frame>* frames) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    std::optional<Frame> f = Read(static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (f) {
      if (frames) frames->push_back(std::move(*f));
      continue;
    }
    if (closed_) return true;
    if (left.count() <= 0) return false;
  }
}

std::optional<Frame> Handshake(Conn& c, const std::string& settings) {
  if (!c.Send(std::string(kPreface) + settings)) return std::nullopt;
  for (int i = 0; i < 16; ++i) {
    std::optional<Frame> f = c.Read(5000);
    if (!f) return std::nullopt;
    if (f->type == kSettings && !(f->flags & kAck)) {
      if (!c.Send(MakeFrame(kSettings, kAck, 0, ""))) return std::nullopt;
      return f;
    }
  }
  return std::nullopt;
}

}  // namespace aotid::testing::h2
