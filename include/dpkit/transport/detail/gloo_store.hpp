// dpkit internals: the key-value stores behind a Gloo store URL
// (file:///dir, redis://host:port/job, tcp://host:port), for the Gloo
// transport's rendezvous (as a gloo::rendezvous::Store) and for elastic
// membership, which needs more than Gloo's own stores give: a key created at
// most once by exactly one of several racing writers (Gloo's FileStore
// checks, then renames: two writers can both succeed), keys that can be
// overwritten (heartbeats; Gloo's stores write each key once), and waits
// measured in milliseconds (Gloo's FileStore counts whole seconds).
//
// tcp://HOST:PORT is a store with no server to run beforehand, as
// torch.distributed's TCPStore(host, port, world_size, is_master): the rank
// told to serve (rank 0: open_kv_store's `rank` argument; tcp_kv_store's
// `serve`) runs the server on a thread of its own process, and every rank,
// rank 0 too, is a client of it over one TCP connection. The URL is the same
// on every rank; who serves is not in the URL but in the rank the caller
// passes (torch's is_master = rank 0 of the env:// init method). The store
// lives as long as rank 0's store object: rank 0 must not close it while
// others still use it. Not for users.
#pragma once

#include "../../core/errors.hpp"

#include <gloo/config.h>
#include <gloo/rendezvous/store.h>

#if GLOO_USE_REDIS && __has_include(<hiredis/hiredis.h>)
#include <hiredis/hiredis.h>
#define DPKIT_GLOO_REDIS 1
#else
#define DPKIT_GLOO_REDIS 0
#endif

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

namespace dpkit::detail {

/// A parsed store URL: file:///path, redis://host[:port]/job or
/// tcp://host:port.
struct gloo_store_url {
  bool redis = false;
  bool tcp = false;
  std::string path;       // file: absolute directory
  std::string host;       // redis, tcp
  int port = 6379;        // redis (default 6379), tcp (always given)
  std::string job;        // redis: the job's key namespace
};

/// Parses a store URL. `file:///abs/dir` (a directory, created if missing),
/// `redis://host[:port]/job` (port 1-65535, default 6379; job non-empty) or
/// `tcp://host:port` (port 1-65535, required; nothing after the port but an
/// optional "/"); a host may be an [IPv6] literal.
/// @throws dpkit::invalid_argument naming the URL and what is wrong.
inline gloo_store_url parse_gloo_store_url(std::string_view url) {
  auto bad = [&](const std::string& why) -> invalid_argument {
    return invalid_argument("gloo_transport: store URL '" + std::string(url) + "': " + why +
                            " (expected file:///absolute/directory, redis://host:port/job or tcp://host:port)");
  };
  gloo_store_url u;
  // host[:port] or [v6][:port] into u.host / u.port; returns whether a port was given.
  auto host_port = [&](std::string_view hostport) -> bool {
    std::string_view port;
    if (!hostport.empty() && hostport.front() == '[') {
      const auto close = hostport.find(']');
      if (close == std::string_view::npos) throw bad("unterminated [IPv6] host");
      u.host = std::string(hostport.substr(1, close - 1));
      const std::string_view after = hostport.substr(close + 1);
      if (!after.empty()) {
        if (after.front() != ':') throw bad("junk after the [IPv6] host");
        port = after.substr(1);
        if (port.empty()) throw bad("empty port");
      }
    } else {
      const auto colon = hostport.find(':');
      u.host = std::string(hostport.substr(0, colon));
      if (colon != std::string_view::npos) {
        port = hostport.substr(colon + 1);
        if (port.empty()) throw bad("empty port");
      }
    }
    if (u.host.empty()) throw bad("empty host");
    if (port.empty()) return false;
    long p = 0;
    for (char c : port) {
      if (c < '0' || c > '9') throw bad("port '" + std::string(port) + "' is not a number");
      p = p * 10 + (c - '0');
      if (p > 65535) break;
    }
    if (p < 1 || p > 65535) throw bad("port '" + std::string(port) + "' is out of range 1-65535");
    u.port = static_cast<int>(p);
    return true;
  };
  constexpr std::string_view file = "file://", redis = "redis://", tcp = "tcp://";
  if (url.substr(0, file.size()) == file) {
    const std::string_view rest = url.substr(file.size());
    if (rest.empty() || rest.front() != '/')
      throw bad(rest.empty() ? "no path" : "a file URL names a local absolute path (file:///dir), not a host");
    if (rest.size() == 1) throw bad("the path is the root directory");
    u.path = std::string(rest);
    return u;
  }
  if (url.substr(0, redis.size()) == redis) {
    u.redis = true;
    std::string_view rest = url.substr(redis.size());
    const auto slash = rest.find('/');
    if (slash == std::string_view::npos) throw bad("no job name after the host (redis://host:port/job)");
    u.job = std::string(rest.substr(slash + 1));
    if (u.job.empty()) throw bad("empty job name");
    host_port(rest.substr(0, slash));
    return u;
  }
  if (url.substr(0, tcp.size()) == tcp) {
    u.tcp = true;
    std::string_view rest = url.substr(tcp.size());
    const auto slash = rest.find('/');
    if (slash != std::string_view::npos && slash + 1 != rest.size())
      throw bad("a tcp:// store takes no path (tcp://host:port)");
    if (!host_port(rest.substr(0, slash))) throw bad("no port (tcp://host:port)");
    return u;
  }
  throw bad("unknown scheme");
}

/// A key-value store. As a gloo::rendezvous::Store (what Gloo's rendezvous
/// calls): set() creates a key once (throws when it exists), get() waits for
/// a key then reads it, wait() polls every 2 ms up to its timeout (the
/// store's default timeout when none is given) and throws timeout_error.
/// Beyond it: create() (at most one of racing writers succeeds), put()
/// (overwrite), try_get(), exists(). Thread-safe.
class kv_store : public ::gloo::rendezvous::Store {
public:
  explicit kv_store(std::string where, std::chrono::milliseconds timeout)
      : where_(std::move(where)), timeout_(timeout) {}
  /// Writes `value` under `key` unless the key exists; true if this call
  /// wrote it. Of several racing callers exactly one gets true.
  virtual bool create(const std::string& key, const std::vector<char>& value) = 0;
  /// Writes `value` under `key`, replacing what was there (readers see the
  /// old or the new value whole).
  virtual void put(const std::string& key, const std::vector<char>& value) = 0;
  /// The value under `key`, or nullopt.
  virtual std::optional<std::vector<char>> try_get(const std::string& key) = 0;
  /// Whether `key` exists.
  virtual bool exists(const std::string& key) = 0;

  void set(const std::string& key, const std::vector<char>& data) override {
    if (!create(key, data))
      throw error(where_ + ": key '" + key + "' already set (keys of an earlier group with the same prefix?)");
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    auto v = try_get(key);
    if (!v) throw error(where_ + ": key '" + key + "' vanished");
    return *v;
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (const auto& k : keys)
      while (!exists(k)) {
        if (std::chrono::steady_clock::now() >= until)
          throw timeout_error(where_ + ": waited " + std::to_string(timeout.count()) + " ms for key '" + k + "'");
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
  }
  /// The default timeout of wait() and get().
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// What error messages call this store: "store 'URL'".
  const std::string& where() const noexcept { return where_; }

protected:
  std::string where_;
  std::chrono::milliseconds timeout_;
};

/// A directory: one file per key (the key, %-escaped, as its name). create()
/// links a written temporary file to the key's name (link(2) fails when the
/// name exists: one racing writer wins); put() renames one over it.
class file_kv_store final : public kv_store {
public:
  /// @throws dpkit::error if the directory cannot be created.
  file_kv_store(const std::string& dir, std::string where, std::chrono::milliseconds timeout)
      : kv_store(std::move(where), timeout), dir_(dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_))
      throw error(where_ + ": cannot create the directory '" + dir_ +
                  "': " + (ec ? ec.message() : std::string("not a directory")));
  }
  bool create(const std::string& key, const std::vector<char>& value) override {
    const std::string tmp = write_temp(key, value);
    const int rc = ::link(tmp.c_str(), path(key).c_str());
    const int err = errno;
    ::unlink(tmp.c_str());
    if (rc == 0) return true;
    if (err == EEXIST) return false;
    throw error(where_ + ": cannot create key '" + key + "' (" + path(key) + "): " + std::strerror(err));
  }
  void put(const std::string& key, const std::vector<char>& value) override {
    const std::string tmp = write_temp(key, value);
    if (::rename(tmp.c_str(), path(key).c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      throw error(where_ + ": cannot write key '" + key + "': " + std::strerror(err));
    }
  }
  std::optional<std::vector<char>> try_get(const std::string& key) override {
    const int fd = ::open(path(key).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return std::nullopt;
      throw error(where_ + ": cannot read key '" + key + "': " + std::strerror(errno));
    }
    std::vector<char> v;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      v.insert(v.end(), buf, buf + n);
    }
    ::close(fd);
    return v;
  }
  bool exists(const std::string& key) override { return ::access(path(key).c_str(), F_OK) == 0; }

private:
  std::string path(const std::string& key) const {
    std::string name;
    for (unsigned char c : key) {
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
          (c == '.' && !name.empty())) {
        name += static_cast<char>(c);
      } else {
        static constexpr char hex[] = "0123456789ABCDEF";
        name += '%';
        name += hex[c >> 4];
        name += hex[c & 15];
      }
    }
    if (name.size() > 240) throw invalid_argument(where_ + ": key '" + key + "' is too long for a file name");
    return dir_ + "/" + name;
  }
  // A fully written temporary file (a name no other writer uses) in dir_.
  std::string write_temp(const std::string& key, const std::vector<char>& value) {
    static std::atomic<unsigned long> counter{0};
    const std::string tmp = dir_ + "/.tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) throw error(where_ + ": cannot write key '" + key + "' (" + tmp + "): " + std::strerror(errno));
    std::size_t done = 0;
    while (done < value.size()) {
      const ssize_t n = ::write(fd, value.data() + done, value.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        throw error(where_ + ": cannot write key '" + key + "': " + std::strerror(err));
      }
      done += static_cast<std::size_t>(n);
    }
    ::close(fd);
    return tmp;
  }
  std::string dir_;
};

#if DPKIT_GLOO_REDIS
/// A Redis server: create() is SET NX, put() SET, try_get() GET, exists()
/// EXISTS; one connection, commands serialized by a mutex, each bounded by
/// 10 s (connecting too).
class redis_kv_store final : public kv_store {
public:
  /// @throws dpkit::error when the server cannot be reached.
  redis_kv_store(const std::string& host, int port, std::string where, std::chrono::milliseconds timeout)
      : kv_store(std::move(where), timeout) {
    const timeval tv{10, 0};
    ctx_ = redisConnectWithTimeout(host.c_str(), port, tv);
    if (!ctx_ || ctx_->err) {
      const std::string why = ctx_ ? ctx_->errstr : "out of memory";
      if (ctx_) redisFree(ctx_);
      ctx_ = nullptr;
      throw error(where_ + ": cannot reach the Redis server at " + host + ":" + std::to_string(port) + ": " + why);
    }
    redisSetTimeout(ctx_, tv);
  }
  ~redis_kv_store() override {
    if (ctx_) redisFree(ctx_);
  }
  redis_kv_store(const redis_kv_store&) = delete;
  redis_kv_store& operator=(const redis_kv_store&) = delete;

  bool create(const std::string& key, const std::vector<char>& value) override {
    auto r = command({"SET", key, std::string_view(value.data(), value.size()), "NX"});
    return r->type == REDIS_REPLY_STATUS; // "OK"; nil when the key exists
  }
  void put(const std::string& key, const std::vector<char>& value) override {
    command({"SET", key, std::string_view(value.data(), value.size())});
  }
  std::optional<std::vector<char>> try_get(const std::string& key) override {
    auto r = command({"GET", key});
    if (r->type != REDIS_REPLY_STRING) return std::nullopt;
    return std::vector<char>(r->str, r->str + r->len);
  }
  bool exists(const std::string& key) override {
    auto r = command({"EXISTS", key});
    return r->type == REDIS_REPLY_INTEGER && r->integer > 0;
  }

private:
  struct reply_deleter {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
  };
  std::unique_ptr<redisReply, reply_deleter> command(std::initializer_list<std::string_view> args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (auto a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    std::lock_guard lk(mu_);
    if (!ctx_ || ctx_->err) throw error(where_ + ": the connection to the Redis server is broken");
    auto* r = static_cast<redisReply*>(redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (!r) throw error(where_ + ": Redis command " + std::string(*args.begin()) + " failed: " + ctx_->errstr);
    std::unique_ptr<redisReply, reply_deleter> p(r);
    if (r->type == REDIS_REPLY_ERROR)
      throw error(where_ + ": Redis command " + std::string(*args.begin()) + " failed: " + std::string(r->str, r->len));
    return p;
  }
  std::mutex mu_;
  redisContext* ctx_ = nullptr;
};
#endif

// ---- tcp://host:port: a store served by one rank's thread ----

namespace tcp_store_io {

/// The handshake both ends send first ("dpKS", protocol version 1): a client
/// that reaches something else (torchrun's own TCPStore on MASTER_PORT, a web
/// server) fails at once instead of exchanging garbage.
inline constexpr std::uint32_t magic = 0x64704b53u, version = 1;
/// Requests: one byte op, u32 key length, u32 value length, key, value (all
/// integers big-endian). Replies: one byte status (1 true / found, 0 false /
/// absent), u32 length, value.
enum op : std::uint8_t { op_create = 1, op_put = 2, op_get = 3, op_exists = 4 };
/// The largest key and value a request may carry (the server drops a
/// connection that sends more).
inline constexpr std::uint32_t max_key = 64u << 10, max_value = 256u << 20;
inline constexpr std::size_t request_header = 9, reply_header = 5;

enum class result { ok, timeout, closed, failed };

inline void put_u32(char* p, std::uint32_t v) {
  v = htonl(v);
  std::memcpy(p, &v, 4);
}
inline std::uint32_t get_u32(const char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return ntohl(v);
}
inline int ms_until(std::chrono::steady_clock::time_point until) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<long long>(left.count() + 1, 1 << 30));
}
/// Waits until fd is ready for `events` or `until` passes.
inline result wait_fd(int fd, short events, std::chrono::steady_clock::time_point until) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int ms = ms_until(until);
    const int rc = ::poll(&p, 1, ms);
    if (rc > 0) return result::ok; // errors and hang-ups show in the read or write that follows
    if (rc < 0 && errno != EINTR) return result::failed;
    if (rc == 0 && ms == 0) return result::timeout;
  }
}
/// Sends all `n` bytes on a non-blocking socket by `until`.
inline result send_all(int fd, const char* p, std::size_t n, std::chrono::steady_clock::time_point until, int& err) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const result r = wait_fd(fd, POLLOUT, until);
      if (r != result::ok) return r;
      continue;
    }
    err = errno;
    return (errno == EPIPE || errno == ECONNRESET) ? result::closed : result::failed;
  }
  return result::ok;
}
/// Receives exactly `n` bytes from a non-blocking socket by `until`.
inline result recv_all(int fd, char* p, std::size_t n, std::chrono::steady_clock::time_point until, int& err) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) return result::closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const result r = wait_fd(fd, POLLIN, until);
      if (r != result::ok) return r;
      continue;
    }
    err = errno;
    return errno == ECONNRESET ? result::closed : result::failed;
  }
  return result::ok;
}
/// host:port as a message prints it ([v6]:port for an IPv6 literal).
inline std::string endpoint(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}
/// Whether `host` is a loopback literal (127.x.y.z, ::1): the server then
/// listens on it alone.
inline bool loopback_literal(const std::string& host) {
  in_addr a4{};
  if (::inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (::inet_pton(AF_INET6, host.c_str(), &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
  return false;
}

} // namespace tcp_store_io

/// The server of a tcp:// store: a thread of the serving rank's process that
/// accepts any number of clients and answers their requests one at a time
/// from a hash map it alone touches (so of racing create() calls exactly one
/// wins). It listens on every interface (IPv6 with IPv4 mapped, else IPv4),
/// as torch's TCPStore does: MASTER_ADDR is often a name or a service
/// address that is not an address of rank 0's own interfaces; on the
/// loopback address alone when `host` is a loopback literal (a job of one
/// machine is not reachable from the network). SO_REUSEADDR: a port an
/// earlier job's store left in TIME_WAIT can be bound again.
class tcp_store_server {
public:
  /// Binds and listens on `port`; the thread runs until destruction.
  /// @throws dpkit::error naming `where`, the endpoint and the reason when
  ///         the port cannot be bound (in use, a privileged port).
  tcp_store_server(const std::string& host, int port, const std::string& where) {
    namespace io = tcp_store_io;
    const std::string ep = io::endpoint(host, port);
    int err = 0;
    if (io::loopback_literal(host)) {
      addrinfo hints{};
      hints.ai_flags = AI_NUMERICHOST;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* ai = nullptr;
      if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &ai) == 0 && ai) {
        listen_fd_ = bind_listen(ai->ai_family, ai->ai_addr, ai->ai_addrlen, false, err);
        ::freeaddrinfo(ai);
      }
    } else {
      sockaddr_in6 a6{};
      a6.sin6_family = AF_INET6;
      a6.sin6_port = htons(static_cast<std::uint16_t>(port));
      a6.sin6_addr = in6addr_any;
      listen_fd_ = bind_listen(AF_INET6, reinterpret_cast<sockaddr*>(&a6), sizeof a6, true, err);
      if (listen_fd_ < 0 && (err == EAFNOSUPPORT || err == EADDRNOTAVAIL)) {
        sockaddr_in a4{};
        a4.sin_family = AF_INET;
        a4.sin_port = htons(static_cast<std::uint16_t>(port));
        a4.sin_addr.s_addr = htonl(INADDR_ANY);
        listen_fd_ = bind_listen(AF_INET, reinterpret_cast<sockaddr*>(&a4), sizeof a4, false, err);
      }
    }
    if (listen_fd_ < 0)
      throw error(where + ": rank 0 serves this store and cannot listen on port " + std::to_string(port) + " (" + ep +
                  "): " + std::strerror(err) +
                  (err == EADDRINUSE ? std::string(" (another program, or a store of another job, holds the port; under "
                                                   "torchrun MASTER_PORT is the launcher's own store: name a free port, "
                                                   "e.g. DPKIT_RENDEZVOUS=tcp://MASTER_ADDR:PORT)")
                                     : std::string()));
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
      const int e = errno;
      ::close(listen_fd_);
      throw error(where + ": cannot create the store server's wake-up pipe: " + std::strerror(e));
    }
    thread_ = std::thread([this] { serve(); });
  }
  tcp_store_server(const tcp_store_server&) = delete;
  tcp_store_server& operator=(const tcp_store_server&) = delete;
  /// Stops the thread (it wakes at once, or at its next 100 ms poll) and
  /// closes the listening socket and every client connection.
  ~tcp_store_server() {
    stop_.store(true);
    const char c = 0;
    [[maybe_unused]] const ssize_t n = ::write(wake_[1], &c, 1);
    if (thread_.joinable()) thread_.join();
    for (auto& c2 : conns_) ::close(c2.fd);
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

private:
  struct conn {
    int fd = -1;
    bool greeted = false;
    std::vector<char> in;
  };

  static int bind_listen(int family, const sockaddr* a, socklen_t len, bool dual_stack, int& err) {
    const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      err = errno;
      return -1;
    }
    const int one = 1, zero = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (dual_stack) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (::bind(fd, a, len) != 0 || ::listen(fd, 1024) != 0) {
      err = errno;
      ::close(fd);
      return -1;
    }
    return fd;
  }

  void serve() {
    std::vector<pollfd> fds;
    while (!stop_.load()) {
      fds.clear();
      fds.push_back({wake_[0], POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      for (const auto& c : conns_) fds.push_back({c.fd, POLLIN, 0});
      const int rc = ::poll(fds.data(), fds.size(), 100);
      if (rc <= 0) continue;
      if (fds[0].revents) break;
      std::vector<bool> drop(conns_.size(), false);
      for (std::size_t i = 0; i < conns_.size(); ++i)
        if (fds[i + 2].revents) drop[i] = !read_from(conns_[i]);
      for (std::size_t i = conns_.size(); i-- > 0;)
        if (drop[i]) {
          ::close(conns_[i].fd);
          conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i));
        }
      if (fds[1].revents & POLLIN)
        for (;;) {
          const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conns_.push_back({fd, false, {}});
        }
    }
  }

  // Reads what is there and answers every complete request; false: close it
  // (the peer closed, or broke the protocol, or did not read its replies).
  bool read_from(conn& c) {
    namespace io = tcp_store_io;
    char buf[65536];
    for (;;) {
      const ssize_t k = ::recv(c.fd, buf, sizeof buf, 0);
      if (k > 0) {
        c.in.insert(c.in.end(), buf, buf + k);
        continue;
      }
      if (k == 0) return false;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    std::size_t at = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int err = 0;
    if (!c.greeted) {
      if (c.in.size() < 8) return true;
      if (io::get_u32(c.in.data()) != io::magic || io::get_u32(c.in.data() + 4) != io::version) return false;
      char hello[8];
      io::put_u32(hello, io::magic);
      io::put_u32(hello + 4, io::version);
      if (io::send_all(c.fd, hello, 8, until, err) != io::result::ok) return false;
      c.greeted = true;
      at = 8;
    }
    while (c.in.size() - at >= io::request_header) {
      const char* h = c.in.data() + at;
      const auto op = static_cast<std::uint8_t>(h[0]);
      const std::uint32_t klen = io::get_u32(h + 1), vlen = io::get_u32(h + 5);
      if (op < io::op_create || op > io::op_exists || klen > io::max_key || vlen > io::max_value) return false;
      if (c.in.size() - at < io::request_header + klen + vlen) break;
      std::string key(h + io::request_header, klen);
      const char* v = h + io::request_header + klen;
      std::uint8_t status = 0;
      const std::vector<char>* out = nullptr;
      switch (op) {
      case io::op_create: status = data_.try_emplace(std::move(key), v, v + vlen).second ? 1 : 0; break;
      case io::op_put: data_[std::move(key)].assign(v, v + vlen); status = 1; break;
      case io::op_get: {
        const auto it = data_.find(key);
        if (it != data_.end()) {
          status = 1;
          out = &it->second;
        }
        break;
      }
      default: status = data_.count(key) ? 1 : 0; break;
      }
      at += io::request_header + klen + vlen;
      char r[io::reply_header];
      r[0] = static_cast<char>(status);
      io::put_u32(r + 1, out ? static_cast<std::uint32_t>(out->size()) : 0u);
      if (io::send_all(c.fd, r, sizeof r, until, err) != io::result::ok) return false;
      if (out && !out->empty() && io::send_all(c.fd, out->data(), out->size(), until, err) != io::result::ok)
        return false;
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(at));
    return true;
  }

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  std::vector<conn> conns_;
  std::unordered_map<std::string, std::vector<char>> data_;
  std::thread thread_;
};

/// A tcp://host:port store: a client of the store's server over one TCP
/// connection (requests serialized by a mutex), and the server itself when
/// `serve` (rank 0). Connecting retries until the timeout, as torch's
/// TCPStore does while its server starts (the first rank may start last);
/// every reply is awaited until the timeout too. A store this client cannot
/// reach in time gives timeout_error; a lost connection (the serving
/// process ended) gives dpkit::error, and so does every later request.
class tcp_kv_store final : public kv_store {
public:
  /// @param serve run the server here (exactly one rank of the job: rank 0).
  /// @param timeout limit of connecting (retried until then), of each
  ///        request's reply, and the default of wait() and get().
  /// @throws dpkit::timeout_error naming `where` when no server answers
  ///         within `timeout`; dpkit::error when the port cannot be bound
  ///         (serve) or something else than a dpkit store answers.
  tcp_kv_store(const std::string& host, int port, bool serve, std::string where, std::chrono::milliseconds timeout)
      : kv_store(std::move(where), timeout), host_(host), port_(port) {
    if (serve) server_ = std::make_unique<tcp_store_server>(host, port, where_);
    connect();
  }
  ~tcp_kv_store() override {
    if (fd_ >= 0) ::close(fd_);
    server_.reset(); // after our own connection: the server closes the rest
  }
  tcp_kv_store(const tcp_kv_store&) = delete;
  tcp_kv_store& operator=(const tcp_kv_store&) = delete;

  bool create(const std::string& key, const std::vector<char>& value) override {
    return request(tcp_store_io::op_create, key, &value, nullptr);
  }
  void put(const std::string& key, const std::vector<char>& value) override {
    request(tcp_store_io::op_put, key, &value, nullptr);
  }
  std::optional<std::vector<char>> try_get(const std::string& key) override {
    std::vector<char> v;
    if (!request(tcp_store_io::op_get, key, nullptr, &v)) return std::nullopt;
    return v;
  }
  bool exists(const std::string& key) override { return request(tcp_store_io::op_exists, key, nullptr, nullptr); }
  /// Whether this object runs the store's server.
  bool serving() const noexcept { return server_ != nullptr; }

private:
  void connect() {
    namespace io = tcp_store_io;
    using clock = std::chrono::steady_clock;
    const auto until = clock::now() + timeout_;
    const std::string ep = io::endpoint(host_, port_);
    std::string last = "no attempt";
    auto backoff = std::chrono::milliseconds(10);
    for (;;) {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* list = nullptr;
      const int gai = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &list);
      if (gai != 0) last = std::string("cannot resolve '") + host_ + "': " + ::gai_strerror(gai);
      for (addrinfo* ai = list; ai && fd_ < 0; ai = ai->ai_next) {
        const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
          last = std::strerror(errno);
          continue;
        }
        int err = 0;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
          err = errno;
          if (err == EINPROGRESS) {
            const io::result r = io::wait_fd(fd, POLLOUT, until);
            socklen_t len = sizeof err;
            if (r != io::result::ok) err = ETIMEDOUT;
            else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
          }
        }
        if (err != 0) {
          last = std::strerror(err);
          ::close(fd);
          continue;
        }
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fd_ = fd;
      }
      if (list) ::freeaddrinfo(list);
      if (fd_ >= 0) break;
      if (clock::now() >= until)
        throw timeout_error(where_ + ": no store server answered at " + ep + " within " +
                            std::to_string(timeout_.count()) + " ms (last attempt: " + last +
                            "; rank 0 serves it: is rank 0 running, and is " + host_ + " its address?)");
      std::this_thread::sleep_for(std::min<clock::duration>(backoff, until - clock::now()));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
    // The handshake: something else listening there (torchrun's own store
    // on MASTER_PORT) either closes, answers something else, or stays
    // silent: 10 s at most, within the timeout.
    char hello[8], reply[8];
    io::put_u32(hello, io::magic);
    io::put_u32(hello + 4, io::version);
    const auto hs_until = std::min(until, clock::now() + std::chrono::seconds(10));
    int err = 0;
    io::result r = io::send_all(fd_, hello, 8, hs_until, err);
    if (r == io::result::ok) r = io::recv_all(fd_, reply, 8, hs_until, err);
    if (r == io::result::ok && io::get_u32(reply) == io::magic && io::get_u32(reply + 4) == io::version) return;
    ::close(fd_);
    fd_ = -1;
    const std::string what = where_ + ": the program listening at " + ep + " is not a dpkit store (";
    const std::string hint = "; under torchrun MASTER_PORT is the launcher's own store: name a free port, e.g. "
                             "DPKIT_RENDEZVOUS=tcp://MASTER_ADDR:PORT)";
    if (r == io::result::timeout && hs_until == until)
      throw timeout_error(what + "no handshake within the store's timeout of " + std::to_string(timeout_.count()) +
                          " ms" + hint);
    throw error(what + (r == io::result::ok        ? std::string("it answered the handshake with something else")
                        : r == io::result::timeout ? std::string("no handshake reply within 10 s")
                        : r == io::result::closed  ? std::string("it closed the connection at the handshake")
                                                   : std::string(std::strerror(err))) +
                hint);
  }

  // One request and its reply; the reply's status. `value` is sent (create,
  // put); `out` receives the reply's value (get).
  bool request(std::uint8_t op, const std::string& key, const std::vector<char>* value, std::vector<char>* out) {
    namespace io = tcp_store_io;
    static constexpr const char* names[] = {"", "create", "put", "get", "exists"};
    const std::string what = std::string(names[op]) + " of key '" + key + "'";
    if (key.size() > io::max_key)
      throw invalid_argument(where_ + ": " + what.substr(0, 64) + "...: the key has " + std::to_string(key.size()) +
                             " bytes, more than " + std::to_string(io::max_key));
    if (value && value->size() > io::max_value)
      throw invalid_argument(where_ + ": " + what + ": the value has " + std::to_string(value->size()) +
                             " bytes, more than " + std::to_string(io::max_value));
    std::lock_guard lk(mu_);
    if (fd_ < 0) throw error(where_ + ": " + what + ": the connection to the store's server was lost earlier");
    const auto until = std::chrono::steady_clock::now() + timeout_;
    const std::uint32_t vlen = value ? static_cast<std::uint32_t>(value->size()) : 0u;
    std::vector<char> msg(io::request_header + key.size() + vlen);
    msg[0] = static_cast<char>(op);
    io::put_u32(msg.data() + 1, static_cast<std::uint32_t>(key.size()));
    io::put_u32(msg.data() + 5, vlen);
    std::memcpy(msg.data() + io::request_header, key.data(), key.size());
    if (vlen) std::memcpy(msg.data() + io::request_header + key.size(), value->data(), vlen);
    int err = 0;
    io::result r = io::send_all(fd_, msg.data(), msg.size(), until, err);
    char h[io::reply_header];
    if (r == io::result::ok) r = io::recv_all(fd_, h, sizeof h, until, err);
    std::uint32_t len = 0;
    if (r == io::result::ok) {
      len = io::get_u32(h + 1);
      if (len > io::max_value) r = io::result::failed;
      else if (out) {
        out->resize(len);
        if (len) r = io::recv_all(fd_, out->data(), len, until, err);
      } else if (len) {
        r = io::result::failed; // only get's replies carry a value
      }
    }
    if (r == io::result::ok) return h[0] != 0;
    // The stream is out of step (or gone): no later request may use it.
    ::close(fd_);
    fd_ = -1;
    const std::string ep = io::endpoint(host_, port_);
    if (r == io::result::timeout)
      throw timeout_error(where_ + ": " + what + ": no reply from the store's server at " + ep + " within " +
                          std::to_string(timeout_.count()) + " ms");
    if (r == io::result::closed)
      throw error(where_ + ": " + what + ": the store's server at " + ep +
                  " closed the connection (rank 0, which serves it, ended or closed its store)");
    throw error(where_ + ": " + what + ": " + (err ? std::strerror(err) : "a malformed reply") + " (server " + ep +
                ")");
  }

  std::string host_;
  int port_;
  std::unique_ptr<tcp_store_server> server_;
  std::mutex mu_;
  int fd_ = -1;
};

/// Opens the store `url` names (its keys under "dpkit" for a file or tcp
/// store, "dpkit/<job>" for Redis: the returned prefix). The store's own
/// messages say "store 'URL'"; `where` (the caller) prefixes the errors of
/// opening. For tcp://host:port, `rank` says who serves: rank 0 runs the
/// server (torch's TCPStore is_master), every rank >= 0 is a client; a
/// caller that does not know its rank (-1) cannot open a tcp:// store.
/// @throws dpkit::invalid_argument for a bad URL (or redis:// without Redis
///         support, or tcp:// with rank < 0); dpkit::timeout_error when a
///         tcp:// store's server does not answer within `timeout`;
///         dpkit::error when the store cannot be opened.
inline std::unique_ptr<kv_store> open_kv_store(const std::string& url, const std::string& where,
                                               std::chrono::milliseconds timeout, std::string& prefix, int rank = -1) {
  const gloo_store_url u = parse_gloo_store_url(url);
  const std::string w = "store '" + url + "'";
  try {
    if (u.redis) {
#if DPKIT_GLOO_REDIS
      prefix = "dpkit/" + u.job;
      return std::make_unique<redis_kv_store>(u.host, u.port, w, timeout);
#else
      throw invalid_argument(w + ": this build has no Redis store (Gloo without GLOO_USE_REDIS, or no hiredis headers)");
#endif
    }
    if (u.tcp) {
      if (rank < 0)
        throw invalid_argument(w + ": a tcp:// store is served by rank 0, and this caller does not pass its rank "
                                   "(open it with dpkit::connect_launch or open_kv_store(..., rank))");
      prefix = "dpkit";
      return std::make_unique<tcp_kv_store>(u.host, u.port, rank == 0, w, timeout);
    }
    prefix = "dpkit";
    return std::make_unique<file_kv_store>(u.path, w, timeout);
  } catch (const invalid_argument& e) {
    throw invalid_argument(where + ": " + e.what());
  } catch (const timeout_error& e) {
    throw timeout_error(where + ": " + e.what());
  } catch (const error& e) {
    throw error(where + ": " + e.what());
  }
}

} // namespace dpkit::detail
