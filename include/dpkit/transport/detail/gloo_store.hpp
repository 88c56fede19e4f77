// dpkit internals: the key-value stores behind a Gloo store URL
// (file:///dir, redis://host:port/job), for the Gloo transport's rendezvous
// (as a gloo::rendezvous::Store) and for elastic membership, which needs
// more than Gloo's own stores give: a key created at most once by exactly one
// of several racing writers (Gloo's FileStore checks, then renames: two
// writers can both succeed), keys that can be overwritten (heartbeats; Gloo's
// stores write each key once), and waits measured in milliseconds (Gloo's
// FileStore counts whole seconds). Not for users.
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

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace dpkit::detail {

/// A parsed store URL: file:///path or redis://host[:port]/job.
struct gloo_store_url {
  bool redis = false;
  std::string path;       // file: absolute directory
  std::string host;       // redis
  int port = 6379;        // redis
  std::string job;        // redis: the job's key namespace
};

/// Parses a store URL. `file:///abs/dir` (a directory, created if missing)
/// or `redis://host[:port]/job` (port 1-65535, default 6379; host may be an
/// [IPv6] literal; job non-empty).
/// @throws dpkit::invalid_argument naming the URL and what is wrong.
inline gloo_store_url parse_gloo_store_url(std::string_view url) {
  auto bad = [&](const std::string& why) -> invalid_argument {
    return invalid_argument("gloo_transport: store URL '" + std::string(url) + "': " + why +
                            " (expected file:///absolute/directory or redis://host:port/job)");
  };
  gloo_store_url u;
  constexpr std::string_view file = "file://", redis = "redis://";
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
    std::string_view hostport = rest.substr(0, slash);
    u.job = std::string(rest.substr(slash + 1));
    if (u.job.empty()) throw bad("empty job name");
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
    if (!port.empty()) {
      long p = 0;
      for (char c : port) {
        if (c < '0' || c > '9') throw bad("port '" + std::string(port) + "' is not a number");
        p = p * 10 + (c - '0');
        if (p > 65535) break;
      }
      if (p < 1 || p > 65535) throw bad("port '" + std::string(port) + "' is out of range 1-65535");
      u.port = static_cast<int>(p);
    }
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

/// Opens the store `url` names (its keys under "dpkit" for a file store,
/// "dpkit/<job>" for Redis: the returned prefix). The store's own messages
/// say "store 'URL'"; `where` (the caller) prefixes the errors of opening.
/// @throws dpkit::invalid_argument for a bad URL (or redis:// without Redis
///         support); dpkit::error when the store cannot be opened.
inline std::unique_ptr<kv_store> open_kv_store(const std::string& url, const std::string& where,
                                               std::chrono::milliseconds timeout, std::string& prefix) {
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
    prefix = "dpkit";
    return std::make_unique<file_kv_store>(u.path, w, timeout);
  } catch (const invalid_argument& e) {
    throw invalid_argument(where + ": " + e.what());
  } catch (const error& e) {
    throw error(where + ": " + e.what());
  }
}

} // namespace dpkit::detail
