#include "rpc/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <google/protobuf/message.h>
#include <grpc/support/log.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_posix.h>
#include <grpcpp/version_info.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "base/fd.h"
#include "base/log.h"
#include "base/mutex.h"

// grpc::AddInsecureChannelFromFd is declared where gRPC can serve a socket
// it did not accept: Linux, and macOS unless gRPC was built for CFStream
// (iOS's). Say so here rather than as an undeclared name below.
#ifndef GPR_SUPPORT_CHANNELS_FROM_FD
#error "rpc/server.cc needs a gRPC that serves sockets handed to it (GPR_SUPPORT_CHANNELS_FROM_FD)"
#endif

namespace aotid::rpc {
namespace {

// One connection handed to gRPC, as it was when accepted: its descriptor
// names the same socket while the connection is open.
struct Counted {
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;
  sockaddr_storage peer{};
  socklen_t peer_len = 0;
  std::string address;
};

bool SamePeer(int fd, const Counted& c) {
  sockaddr_storage now{};
  socklen_t len = sizeof now;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&now), &len) != 0) return false;
  return len == c.peer_len && std::memcmp(&now, &c.peer, len) == 0;
}

// Whether the descriptor still names the socket `c` was accepted as: the
// same inode, a socket, the same peer (address and port). Once gRPC has
// closed it the number is free, or names something else.
bool StillOpen(const Counted& c) {
  struct stat st {};
  if (::fstat(c.fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  if (st.st_dev != c.dev || st.st_ino != c.ino) return false;
  return SamePeer(c.fd, c);
}

}  // namespace

void RouteLibraryLogs() {
  static std::once_flag once;
  std::call_once(once, [] {
  // Newer protobuf logs through abseil, and newer gRPC too: there these
  // are gone, and what they log goes abseil's way.
#if defined(GOOGLE_PROTOBUF_VERSION) && GOOGLE_PROTOBUF_VERSION < 4022000
    google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int,
                                       const std::string& message) { LOG_DEBUG << "protobuf: " << message; });
#endif
#if GRPC_CPP_VERSION_MAJOR == 1 && GRPC_CPP_VERSION_MINOR < 65
    gpr_set_log_function([](gpr_log_func_args* args) { LOG_DEBUG << "grpc: " << args->message; });
#endif
  });
}

int64_t BufferBudget(const ServerOptions& o) {
  if (o.max_buffered_bytes > 0) return o.max_buffered_bytes;
  return std::max<int64_t>(4 * o.max_message_bytes, int64_t{64} << 20);
}

class Server::Impl {
 public:
  Impl(ServerOptions options, grpc::Service* service) : opts_(std::move(options)), service_(service) {}

  ~Impl() {
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (wake_[0] >= 0) ::close(wake_[0]);
    if (wake_[1] >= 0) ::close(wake_[1]);
  }

  StatusOr<int> Bind() {
    RouteLibraryLogs();
    RETURN_IF_ERROR(fd::Pipe(wake_, /*nonblocking=*/true));
    ASSIGN_OR_RETURN(int bound, fd::ListenTcp(opts_.host, opts_.port, " for gRPC",
                                              "set server.grpc_listen or --grpc-listen", &listen_fd_));

    // gRPC's own health service, made by BuildAndStart when this
    // process-wide switch is on; every aotid gRPC server has one.
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_);
    grpc::ResourceQuota quota("aotid-grpc");
    quota.Resize(static_cast<size_t>(BufferBudget(opts_)));
    builder.SetResourceQuota(quota);
    builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(opts_.max_message_bytes, INT32_MAX)));
    builder.SetMaxSendMessageSize(-1);  // an answer is as large as the model's outputs
    auto ms = [](int s) { return static_cast<int>(std::min<int64_t>(int64_t{s} * 1000, INT32_MAX)); };
    builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, opts_.max_metadata_bytes);
#ifdef GRPC_ARG_ABSOLUTE_MAX_METADATA_SIZE
    // gRPC since 2023 (after 1.51, Debian's, which has one hard limit;
    // Homebrew's is newer) takes GRPC_ARG_MAX_METADATA_SIZE as a soft
    // limit, refusing only some calls between it and a hard one (by
    // default the larger of 1.25 times it and 16 KiB). The same number
    // for both keeps it what the HTTP header limit is: every call over it
    // is refused.
    builder.AddChannelArgument(GRPC_ARG_ABSOLUTE_MAX_METADATA_SIZE, opts_.max_metadata_bytes);
#endif
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, opts_.max_streams_per_connection);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(opts_.keepalive_time_s));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms(opts_.keepalive_timeout_s));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                               ms(opts_.min_ping_interval_s));
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms(opts_.idle_timeout_s));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, ms(opts_.max_connection_age_s));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, ms(opts_.max_connection_age_grace_s));
    server_ = builder.BuildAndStart();
    if (!server_) return InvalidArgument("gRPC would not start with these settings");
    UpdateHealth();
    return bound;
  }

  void Serve() {
    while (!stopping_.load()) {
      pollfd fds[2] = {{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      int r = ::poll(fds, 2, 1000);
      if (stopping_.load()) break;
      Sweep();
      if (std::chrono::steady_clock::now() >= next_health_) UpdateHealth();
      if (r <= 0) continue;
      if (fds[0].revents) {
        char drain[64];
        while (::read(wake_[0], drain, sizeof drain) > 0) {
        }
      }
      if (fds[1].revents & POLLIN) Accept();
    }
    ::close(listen_fd_);
    listen_fd_ = -1;
    // Every name NOT_SERVING from here on (Watch calls are told at once).
    if (auto* health = server_ ? server_->GetHealthCheckService() : nullptr) health->Shutdown();
    // The calls in flight are answered first, within the drain, while the
    // connections open still take calls. gRPC's Shutdown then gets a
    // second at most: it cancels what is left, and would otherwise wait
    // the whole drain for a connection that never made a call.
    const auto drain_end = std::chrono::steady_clock::now() + std::chrono::seconds(opts_.drain_timeout_s);
    while (in_flight_ && in_flight_() > 0 && std::chrono::steady_clock::now() < drain_end)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(drain_end - std::chrono::steady_clock::now());
    auto grace = std::clamp(left, std::chrono::milliseconds(0), std::chrono::milliseconds(1000));
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + grace);
  }

  void SetInFlight(std::function<size_t()> in_flight) { in_flight_ = std::move(in_flight); }
  void SetHealth(HealthStatuses statuses) { health_ = std::move(statuses); }

  void Stop() {
    stopping_.store(true);
    if (wake_[1] >= 0) {
      char c = 1;
      [[maybe_unused]] ssize_t n = ::write(wake_[1], &c, 1);
    }
  }

  size_t Connections() const {
    MutexLock lock(&mu_);
    return counted_.size();
  }

 private:
  void Accept() {
    for (int i = 0; i < 64; ++i) {
      sockaddr_storage peer{};
      socklen_t len = sizeof peer;
      int fd = ::accept(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE)
          LOG_WARNING << "cannot accept a gRPC connection: " << std::strerror(errno);
        return;
      }
      fd::SetCloseOnExec(fd, /*nonblocking=*/true);
      Counted c;
      c.fd = fd;
      c.peer = peer;
      c.peer_len = len;
      c.address = fd::PeerAddress(peer);
      struct stat st {};
      ::fstat(fd, &st);
      c.dev = st.st_dev;
      c.ino = st.st_ino;
      {
        MutexLock lock(&mu_);
        // The number was free, so whatever was counted under it has closed.
        std::erase_if(counted_, [&](const Counted& old) { return old.fd == fd; });
        if (opts_.max_connections_per_address > 0) {
          int n = 0;
          for (const Counted& old : counted_) n += old.address == c.address;
          if (n >= opts_.max_connections_per_address) {
            LOG_DEBUG << "refused a gRPC connection from " << c.address << ": it holds " << n
                      << " (server.max_connections_per_address)";
            ::close(fd);
            continue;
          }
        }
        counted_.push_back(c);
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small replies must not wait
#ifdef SO_NOSIGPIPE
      ::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
      grpc::AddInsecureChannelFromFd(server_.get(), fd);  // gRPC owns it now
    }
  }

  // The health service's answers, from health_.
  void UpdateHealth() {
    next_health_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    auto* health = server_ ? server_->GetHealthCheckService() : nullptr;
    if (!health || !health_) return;
    // Only a change: gRPC sends each SetServingStatus to every Watch call,
    // changed or not.
    for (const auto& [name, serving] : health_()) {
      auto [it, added] = health_set_.try_emplace(name, serving);
      if (!added && it->second == serving) continue;
      it->second = serving;
      health->SetServingStatus(name, serving);
    }
  }

  // Counts out the connections gRPC has closed.
  void Sweep() {
    MutexLock lock(&mu_);
    std::erase_if(counted_, [](const Counted& c) { return !StillOpen(c); });
  }

  const ServerOptions opts_;
  grpc::Service* service_;
  std::unique_ptr<grpc::Server> server_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::function<size_t()> in_flight_;
  HealthStatuses health_;
  std::map<std::string, bool> health_set_;  // what the health service was last told
  std::chrono::steady_clock::time_point next_health_;
  mutable Mutex mu_;
  std::vector<Counted> counted_ GUARDED_BY(mu_);
};

Server::Server(ServerOptions options, grpc::Service* service)
    : impl_(std::make_unique<Impl>(std::move(options), service)) {}

Server::~Server() = default;

Status Server::Bind() {
  ASSIGN_OR_RETURN(port_, impl_->Bind());
  return Status::OK();
}

void Server::Serve() { impl_->Serve(); }

void Server::Stop() { impl_->Stop(); }

void Server::SetInFlight(std::function<size_t()> in_flight) { impl_->SetInFlight(std::move(in_flight)); }

void Server::SetHealth(HealthStatuses statuses) { impl_->SetHealth(std::move(statuses)); }

size_t Server::TEST_connections() const { return impl_->Connections(); }

}  // namespace aotid::rpc
