// dpkit internals: the shared segment of the shm refinement
// (shared_memory_transport, concept.hpp). Every rank of a transport owns one
// region of a segment that all ranks map: a control line (its step counter
// and an abort word) and two data buffers of `slot_bytes` each. The memory is
// an MPI-3 shared window (mpi, when every rank is on one node) or a block the
// inproc_world owns. The shm algorithms (collectives/detail/shm.hpp) run in
// numbered steps over it; docs/algorithms.md "Shared memory" describes the
// protocol. Not for users.
#pragma once

#include "../../core/errors.hpp"
#include "health.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace dpkit::detail {

/// One rank's control line in the segment. `step` is the rank's step
/// counter: (step number << 20) | (low 20 bits of the running collective's
/// fingerprint hash); only its owner writes it (release), peers read it
/// (acquire). `abort` is set (by any rank) when a collective failed, so
/// waiters stop at once. `fp_words` hold the fingerprint of the collective
/// the rank runs now (any algorithm), under the seqlock `fp_version` (odd
/// while being written), so a rank waiting in a shm collective can name what
/// a peer runs instead and detect a mismatch.
inline constexpr std::size_t shm_fp_words = (sizeof(fingerprint) + 7) / 8;
struct alignas(64) shm_control {
  std::atomic<std::uint64_t> step{0};
  char pad0[56];
  std::atomic<std::uint32_t> abort{0};
  char pad1[60];
  std::atomic<std::uint64_t> fp_version{0};
  std::atomic<std::uint64_t> fp_words[shm_fp_words]{};
};
static_assert(sizeof(shm_control) == 192);
static_assert(shm_fp_words <= 7);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

inline constexpr int shm_hash_bits = 20;
inline constexpr std::uint64_t shm_hash_mask = (std::uint64_t{1} << shm_hash_bits) - 1;

/// Bytes of one rank's region for data buffers of `slot_bytes` each.
inline std::size_t shm_region_bytes(std::size_t slot_bytes) noexcept {
  return sizeof(shm_control) + 2 * ((slot_bytes + 63) / 64 * 64);
}

/// A view of a shared segment as seen from one rank: where every rank's
/// control line and buffers are mapped in this process. Process-local (its
/// pointers differ between processes); the memory it points to is shared.
class shm_segment {
public:
  shm_segment() = default;
  /// `bases[p]` is rank p's region (shm_region_bytes(slot_bytes) bytes, 64-byte aligned).
  /// Throws dpkit::error naming the rank and the address when a base is not
  /// 64-byte aligned (the control line is an alignas(64) object).
  shm_segment(int rank, std::vector<std::byte*> bases, std::size_t slot_bytes)
      : rank_(rank), bases_(std::move(bases)), slot_bytes_(slot_bytes / 64 * 64) {
    for (std::size_t p = 0; p < bases_.size(); ++p)
      if (reinterpret_cast<std::uintptr_t>(bases_[p]) % alignof(shm_control) != 0)
        throw error("shm segment: rank " + std::to_string(rank_) + ": region of rank " + std::to_string(p) +
                    " is not " + std::to_string(alignof(shm_control)) + "-byte aligned");
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return static_cast<int>(bases_.size()); }
  /// Capacity of one data buffer in bytes (a multiple of 64).
  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  /// Rank p's control line.
  shm_control& control(int p) const noexcept { return *reinterpret_cast<shm_control*>(bases_[static_cast<std::size_t>(p)]); }
  /// Rank p's data buffer b (0 or 1).
  std::byte* buffer(int p, int b) const noexcept {
    return bases_[static_cast<std::size_t>(p)] + sizeof(shm_control) + static_cast<std::size_t>(b) * slot_bytes_;
  }
  /// Zeroes this rank's control line (before first use; callers synchronize after).
  void reset_own() const noexcept {
    control(rank_).step.store(0, std::memory_order_relaxed);
    control(rank_).abort.store(0, std::memory_order_relaxed);
    control(rank_).fp_version.store(0, std::memory_order_relaxed);
  }
  /// Sets every rank's abort word (a collective on this segment failed).
  void abort_all() const noexcept {
    for (int p = 0; p < size(); ++p) control(p).abort.store(1, std::memory_order_release);
  }
  /// Publishes fp as what this rank runs now (its own control line).
  /// Threads of one rank may publish at once (a communication thread's wait
  /// and the caller's): the version is taken from even to odd by
  /// compare-exchange, so there is one writer at a time.
  void publish(const fingerprint& fp) const noexcept {
    auto& c = control(rank_);
    std::uint64_t w[shm_fp_words] = {};
    std::memcpy(w, &fp, sizeof fp);
    std::uint64_t v = c.fp_version.load(std::memory_order_relaxed);
    for (;;) {
      if ((v & 1u) == 0 && c.fp_version.compare_exchange_weak(v, v + 1, std::memory_order_acquire,
                                                              std::memory_order_relaxed))
        break;
      if (v & 1u) {
        std::this_thread::yield();
        v = c.fp_version.load(std::memory_order_relaxed);
      }
    }
    std::atomic_thread_fence(std::memory_order_release);
    for (std::size_t i = 0; i < shm_fp_words; ++i) c.fp_words[i].store(w[i], std::memory_order_relaxed);
    c.fp_version.store(v + 2, std::memory_order_release);
  }
  /// What rank p published last (invalid if it is being rewritten now).
  fingerprint published(int p) const noexcept {
    auto& c = control(p);
    const std::uint64_t v1 = c.fp_version.load(std::memory_order_acquire);
    if (v1 & 1u) return {};
    std::uint64_t w[shm_fp_words];
    for (std::size_t i = 0; i < shm_fp_words; ++i) w[i] = c.fp_words[i].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (c.fp_version.load(std::memory_order_relaxed) != v1) return {};
    fingerprint f;
    std::memcpy(&f, w, sizeof f);
    return f;
  }
  /// True once some rank set this rank's abort word.
  bool aborted() const noexcept { return control(rank_).abort.load(std::memory_order_acquire) != 0; }
  /// Guards against two threads running shm collectives on one rank at once.
  std::atomic<bool>& busy() noexcept { return busy_; }

private:
  int rank_ = 0;
  std::vector<std::byte*> bases_;
  std::size_t slot_bytes_ = 0;
  std::atomic<bool> busy_{false};
};

/// Per-buffer data capacity from the environment: DPKIT_SHM_BYTES (bytes per
/// buffer, 0 disables the refinement), else `fallback`.
/// @throws dpkit::invalid_argument on a malformed value.
inline std::size_t shm_bytes_from_env(std::size_t fallback) {
  const char* s = std::getenv("DPKIT_SHM_BYTES");
  if (!s || !*s) return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (!end || *end != '\0' || s[0] == '-')
    throw invalid_argument(std::string("DPKIT_SHM_BYTES: expected a byte count, got '") + s + "'");
  if (v != 0 && v < 4096)
    throw invalid_argument(std::string("DPKIT_SHM_BYTES: ") + s + " is below the minimum of 4096 bytes (0 disables)");
  return static_cast<std::size_t>(v);
}

/// How many pause-spins a wait does before it yields: 256 when the world
/// fits on the machine's cores, else none (a spinning rank would take the
/// core from the peer it waits for).
inline int shm_spin_count(int world_size) noexcept {
  static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<unsigned>(world_size) <= cores ? 256 : 0;
}

/// Waits (`spins` pause-spins, then yield, then short sleeps) until
/// `ready()`; every 16 polls after the spins it calls `check()` (which throws
/// on deadline, abort or peer failure). Spinning is short or absent so that
/// more ranks than cores still progress.
template <class Ready, class Check>
void shm_wait(Ready&& ready, Check&& check, int spins = 256) {
  for (int i = 0; i < spins; ++i) {
    if (ready()) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  const auto start = std::chrono::steady_clock::now();
  for (unsigned polls = 1;; ++polls) {
    if (ready()) return;
    if ((polls & 15u) == 0) {
      check();
      if (std::chrono::steady_clock::now() - start > std::chrono::milliseconds(2)) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
    }
    std::this_thread::yield();
  }
}

/// An owned, zeroed, 64-byte-aligned block holding the regions of n ranks
/// (the inproc_world's segment).
class shm_block {
public:
  shm_block(int n, std::size_t slot_bytes) : n_(n), slot_(slot_bytes / 64 * 64), region_(shm_region_bytes(slot_)) {
    mem_ = static_cast<std::byte*>(::operator new(region_ * static_cast<std::size_t>(n), std::align_val_t{64}));
    for (int p = 0; p < n; ++p) new (mem_ + region_ * static_cast<std::size_t>(p)) shm_control{};
  }
  shm_block(const shm_block&) = delete;
  shm_block& operator=(const shm_block&) = delete;
  ~shm_block() { ::operator delete(mem_, std::align_val_t{64}); }
  /// Rank r's view of the block.
  std::unique_ptr<shm_segment> view(int r) const {
    std::vector<std::byte*> b(static_cast<std::size_t>(n_));
    for (int p = 0; p < n_; ++p) b[static_cast<std::size_t>(p)] = mem_ + region_ * static_cast<std::size_t>(p);
    return std::make_unique<shm_segment>(r, std::move(b), slot_);
  }

private:
  int n_;
  std::size_t slot_, region_;
  std::byte* mem_ = nullptr;
};

} // namespace dpkit::detail
