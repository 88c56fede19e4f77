// dpkit._dist_ext: the store a group meets through when it is launched
// without mpirun (torchrun, env://, file://, tcp://): torch's c10d::Store as
// dpkit's key-value store, and the first agreement every group makes there
// (its size). As torch keeps ProcessGroupGloo's store adapter apart from
// its work classes.
#pragma once

#include "common.hpp"

namespace dpkit_dist {

/// The c10d::Store torch hands a backend's creator (a PrefixStore of the
/// group over torch's TCPStore, FileStore or HashStore) as the store of
/// dpkit's Gloo rendezvous. create() is compareSet(key, "", value), which
/// every torch store implements as "set if absent or equal to the expected
/// value, then return what the key holds": each value is stored behind a
/// header of 'd' and 16 random bytes drawn per call, so the returned value
/// equals this call's exactly when this call wrote it, and of racing writers
/// exactly one wins (an equal value written by another rank never looks like
/// ours, and a stored value is never empty, so compareSet's "expected empty"
/// never matches an existing key). put() is set(); try_get() check() then
/// get(); exists() check(). Waits poll check() (1 ms, growing to 10 ms) up to
/// their own deadline, never torch's blocking wait. Errors of torch's store
/// (a lost connection to the TCPStore's server) become dpkit::error naming
/// the store and the key.
class c10d_kv_store final : public dpkit::detail::kv_store {
public:
  c10d_kv_store(c10::intrusive_ptr<c10d::Store> store, std::string where, std::chrono::milliseconds timeout)
      : kv_store(std::move(where), timeout), store_(std::move(store)), rng_(std::random_device{}() ^ ::getpid()) {}

  bool create(const std::string& key, const std::vector<char>& value) override {
    const std::vector<std::uint8_t> mine = encode(value);
    const auto got = call(key, [&] { return store_->compareSet(key, {}, mine); });
    return got == mine;
  }
  void put(const std::string& key, const std::vector<char>& value) override {
    const std::vector<std::uint8_t> v = encode(value);
    call(key, [&] {
      store_->set(key, v);
      return 0;
    });
  }
  std::optional<std::vector<char>> try_get(const std::string& key) override {
    if (!exists(key)) return std::nullopt;
    const auto v = call(key, [&] { return store_->get(key); });
    if (v.size() < header || v[0] != 'd')
      throw dpkit::error(where_ + ": key '" + key + "' holds " + std::to_string(v.size()) +
                         " bytes not written by dpkit (another program's key under the group's prefix?)");
    return std::vector<char>(v.begin() + header, v.end());
  }
  bool exists(const std::string& key) override {
    return call(key, [&] { return store_->check({key}); });
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto until = std::chrono::steady_clock::now() + timeout;
    auto nap = std::chrono::milliseconds(1);
    for (const auto& k : keys)
      while (!exists(k)) {
        const auto now = std::chrono::steady_clock::now();
        if (now >= until)
          throw dpkit::timeout_error(where_ + ": waited " + std::to_string(timeout.count()) + " ms for key '" + k + "'");
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(nap, until - now));
        nap = std::min(nap * 2, std::chrono::milliseconds(10));
      }
  }
  using kv_store::wait;

private:
  static constexpr std::size_t header = 17;
  std::vector<std::uint8_t> encode(const std::vector<char>& value) {
    std::vector<std::uint8_t> v(header + value.size());
    v[0] = 'd';
    {
      const std::lock_guard lk(mu_);
      for (std::size_t i = 1; i < header; ++i) v[i] = static_cast<std::uint8_t>(rng_());
    }
    std::copy(value.begin(), value.end(), v.begin() + header);
    return v;
  }
  template <class F>
  auto call(const std::string& key, F f) -> decltype(f()) {
    try {
      return f();
    } catch (const dpkit::error&) {
      throw;
    } catch (const c10::Error& e) {
      throw dpkit::error(where_ + ": key '" + key + "': " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw dpkit::error(where_ + ": key '" + key + "': " + e.what());
    }
  }
  c10::intrusive_ptr<c10d::Store> store_;
  std::mutex mu_;
  std::mt19937_64 rng_;
};


/// Every rank of a group meeting through `kv` records its group size under
/// "<root>/size/<rank>" (root: "dpkit", or "dpkit/attempt<k>" in attempt k
/// of a torchrun worker group), then waits for the records of ranks
/// 0..size-1, or
/// for root + "/error" (written by the first rank that saw a disagreement),
/// until `timeout`. A rank that fails this way marks "<root>/failed/<rank>"
/// and waits (within the timeout) for the marks of the ranks it has seen
/// before it throws: the store's server (rank 0's process, for env://)
/// then stays up until every rank that arrived has read the error.
/// @throws dpkit::invalid_argument naming both sizes and ranks when a rank
///         records another size (on every rank: the one that sees it writes
///         the error key, the others read it), or when a rank is taken
///         twice; dpkit::timeout_error naming the ranks missing when the
///         timeout passes first.
inline void agree_on_size(c10d_kv_store& kv, const std::string& root, int rank, int size, std::chrono::milliseconds timeout,
                   const std::string& group_id) {
  const std::string me = "dpkit backend: group '" + group_id + "': rank " + std::to_string(rank) + " of " +
                         std::to_string(size) + ": ";
  const auto bytes = [](const std::string& s) { return std::vector<char>(s.begin(), s.end()); };
  const std::string size_s = std::to_string(size);
  if (!kv.create(root + "/size/" + std::to_string(rank), bytes(size_s)))
    throw dpkit::invalid_argument(me + "another process already joined as rank " + std::to_string(rank) +
                                  " (two processes were given the same RANK?)");
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> seen(static_cast<std::size_t>(size), false);
  seen[static_cast<std::size_t>(rank)] = true;
  // every rank seen so far knows of the failure before this one throws
  const auto fail = [&](const std::string& why) {
    try {
      kv.create(root + "/error", bytes(why));
      kv.put(root + "/failed/" + std::to_string(rank), bytes("1"));
      for (int r = 0; r < size; ++r)
        if (r != rank && seen[static_cast<std::size_t>(r)])
          while (!kv.exists(root + "/failed/" + std::to_string(r)) && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
    } catch (const dpkit::error&) {
      // the store's server has gone: its rank read the error and threw
    }
    throw dpkit::invalid_argument(me + why);
  };
  auto nap = std::chrono::milliseconds(1);
  for (;;) {
    int missing = 0;
    for (int r = 0; r < size; ++r) {
      if (seen[static_cast<std::size_t>(r)]) continue;
      const auto v = kv.try_get(root + "/size/" + std::to_string(r));
      if (!v) {
        ++missing;
        continue;
      }
      seen[static_cast<std::size_t>(r)] = true;
      const std::string theirs(v->begin(), v->end());
      if (theirs != size_s)
        fail("rank " + std::to_string(r) + " says the group has " + theirs + " ranks, rank " + std::to_string(rank) +
             " says " + size_s + " (WORLD_SIZE / world_size differs between the ranks)");
    }
    if (missing == 0) return;
    if (const auto e = kv.try_get(root + "/error")) fail(std::string(e->begin(), e->end()));
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) {
      std::string who;
      for (int r = 0; r < size; ++r)
        if (!seen[static_cast<std::size_t>(r)]) who += (who.empty() ? "" : ", ") + std::to_string(r);
      throw dpkit::timeout_error(me + "rank(s) " + who + " did not join through " + kv.where() + " within " +
                                 std::to_string(timeout.count()) + " ms (not started, or another WORLD_SIZE?)");
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(nap, until - now));
    nap = std::min(nap * 2, std::chrono::milliseconds(20));
  }
}

} // namespace dpkit_dist
