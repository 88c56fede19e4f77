// dpkit internals: the shared segment of the shm refinement
// (shared_memory_transport, concept.hpp). Every rank of a transport owns one
// region of a segment that all ranks map: a control line (its step counter
// and an abort word) and two data buffers of `slot_bytes` each. The memory is
// a POSIX shared-memory object (shm_mapping.hpp; mpi and gloo_transport, the
// latter set up through its store by store_bootstrap.hpp, when every rank is
// on one node) or a block the inproc_world owns. The shm algorithms (collectives/detail/shm.hpp) run in
// numbered steps over it; docs/algorithms.md "Shared memory" describes the
// protocol. Not for users.
#pragma once

#include "../../core/copy_nontemporal.hpp"
#include "../../core/errors.hpp"
#include "health.hpp"

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <signal.h>  // kill (POSIX)
#include <strings.h> // strcasecmp (POSIX)

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

namespace dpkit::detail {

/// One rank's control line in the segment. `step` is the rank's step
/// counter: (step number << 20) | (low 20 bits of the running collective's
/// fingerprint hash); only its owner writes it (seq_cst), peers read it
/// (acquire). `sleepers` counts peers asleep on a futex over the low 32 bits
/// of `step` (which change with every step): the owner wakes them after a
/// store only when it is non-zero, so a wait that never sleeps costs no
/// system call. `abort` is set (by any rank) when a collective failed, so
/// waiters stop at once. `fp_words` hold the fingerprint of the collective
/// the rank runs now (any algorithm), under the seqlock `fp_version` (odd
/// while being written), so a rank waiting in a shm collective can name what
/// a peer runs instead and detect a mismatch. `pid` is the owner's process
/// id where ranks are processes (0 where they are threads of one process),
/// so a waiting peer can tell that the owner's process has ended.
/// `window` is where the rank's buffers of the all-reduce it runs now lie
/// in the node's symmetric memory (collectives/symmetric_memory.hpp; written before the
/// call's first step, read by peers after it), on a line of its own.
inline constexpr std::size_t shm_fp_words = (sizeof(fingerprint) + 7) / 8;
struct alignas(64) shm_control {
  std::atomic<std::uint64_t> step{0};
  std::atomic<std::uint32_t> sleepers{0};
  std::atomic<std::int32_t> pid{0};
  char pad0[48];
  std::atomic<std::uint32_t> abort{0}; // shm_abort_failure | shm_abort_close bits, set by any rank
  std::atomic<std::uint32_t> left{0};  // 1 once this rank closed its transport cleanly
  // rank 0's only: 1 when the two-shot all-reduce's next chunk writes the
  // segment with non-temporal stores (segment_store_tuner), set before a step
  std::atomic<std::uint32_t> store_mode{0};
  char pad1[52];
  std::atomic<std::uint64_t> fp_version{0};
  std::atomic<std::uint64_t> fp_words[shm_fp_words]{};
  // [0] input's window id (0: not in one), [1] the byte offset in the rank's
  // region of its element [4], [2] output's window id, [3] the offset of its
  // element [6]; [4, 5) and [6, 7) the elements of input and output that lie
  // in the window (all of them for a buffer inside it)
  alignas(64) std::atomic<std::uint64_t> window[8]{};
};
static_assert(sizeof(shm_control) == 256);
static_assert(shm_fp_words <= 7);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

/// Why a segment's abort words were set (bits of shm_control::abort): a
/// rank's collective failed, or a rank closed its transport (a clean close:
/// ranks that still exchange with the others may finish what they run).
inline constexpr std::uint32_t shm_abort_failure = 1;
inline constexpr std::uint32_t shm_abort_close = 2;

inline constexpr int shm_hash_bits = 20;
inline constexpr std::uint64_t shm_hash_mask = (std::uint64_t{1} << shm_hash_bits) - 1;

static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

/// The futex word over a step counter: its low 32 bits (bits 20-31 hold the
/// step number's low 12 bits, so every step changes it). The kernel reads it;
/// C++ code only touches the 64-bit atomic.
inline std::uint32_t* shm_futex_word(std::atomic<std::uint64_t>& step) noexcept {
  static_assert(sizeof(std::atomic<std::uint64_t>) == 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return reinterpret_cast<std::uint32_t*>(&step) + 1;
#else
  return reinterpret_cast<std::uint32_t*>(&step);
#endif
}

/// Sleeps on the futex word `addr` while it holds `expected`, at most
/// `timeout_us` microseconds (a shared, not process-private, futex: the
/// segment is mapped by several processes). Returns early on a wake-up, a
/// signal or a changed word; the caller re-checks its condition. Without
/// futexes (not Linux): a plain sleep of the same length.
inline void shm_futex_wait(std::uint32_t* addr, std::uint32_t expected, long timeout_us) noexcept {
#if defined(__linux__)
  const timespec ts{timeout_us / 1000000, (timeout_us % 1000000) * 1000};
  syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, nullptr, 0);
#else
  (void)addr;
  (void)expected;
  std::this_thread::sleep_for(std::chrono::microseconds(timeout_us));
#endif
}

/// Wakes every waiter asleep on the futex word `addr`.
inline void shm_futex_wake(std::uint32_t* addr) noexcept {
#if defined(__linux__)
  syscall(SYS_futex, addr, FUTEX_WAKE, 0x7fffffff, nullptr, nullptr, 0);
#else
  (void)addr;
#endif
}

/// Stores `value` as rank c's step counter and wakes the peers asleep on it.
/// The store is seq_cst so that it is ordered before the load of `sleepers`
/// (a waiter increments `sleepers` before its last look at the counter:
/// either it sees the new value or this sees the waiter).
inline void shm_publish_step(shm_control& c, std::uint64_t value) noexcept {
  c.step.store(value, std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_seq_cst) != 0) shm_futex_wake(shm_futex_word(c.step));
}

/// Bytes of one rank's region for data buffers of `slot_bytes` each.
constexpr std::size_t shm_region_bytes(std::size_t slot_bytes) noexcept {
  return sizeof(shm_control) + 2 * ((slot_bytes + 63) / 64 * 64);
}

/// Faults in, in this process, every 4 KiB page that overlaps the `n` bytes
/// at `p`: writes a zero byte into each (`write`: the caller's own range,
/// with nothing in it yet) or reads one, always at an address inside the
/// range (a range that starts or ends inside a page shares it with memory
/// that others may be using). Touching every 4096th byte from `p` instead
/// misses the last page of a range that does not start on a page: its first
/// use then paid a minor fault (10-15 us on the reference VM) inside
/// whichever collective reached it first.
inline void shm_touch_pages(std::byte* p, std::size_t n, bool write) noexcept {
  if (n == 0) return;
  constexpr std::uintptr_t page = 4096;
  const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(p), end = begin + n;
  for (std::uintptr_t a = begin & ~(page - 1); a < end; a += page) {
    std::byte* q = p + (std::max(a, begin) - begin);
    if (write) *q = std::byte{0};
    else (void)*static_cast<const volatile std::byte*>(q);
  }
}

/// One window of symmetric memory as this process maps it
/// (collectives/symmetric_memory.hpp): `n` regions of `stride` bytes from
/// `base`, region p rank p's, of which `region_bytes` are the caller's.
/// `own`, when not null, is where this rank's region also lies as its user
/// sees it (register_memory: the user's own pages, remapped onto the region);
/// collectives always address the regions from `base`.
struct shm_window_entry {
  std::uint64_t id = 0;
  std::byte* base = nullptr;
  std::size_t stride = 0;
  std::size_t region_bytes = 0;
  std::byte* own = nullptr;
};

/// The part of a buffer that lies in a window (shm_window_registry::cover):
/// bytes [begin, end) of the buffer lie in window `id` from byte `offset` of
/// the rank's region; id 0 (and the rest 0) when no byte does.
struct shm_cover {
  std::uint64_t id = 0;
  std::uint64_t offset = 0;
  std::size_t begin = 0;
  std::size_t end = 0;
};

/// The windows of symmetric memory a rank holds over one shared segment,
/// process-local (each rank maps every window at its own address). Ids count
/// the windows ever created on the segment, 1, 2, ...: creation is
/// collective, so a window has the same id on every rank. Thread-safe (a
/// window may be freed on one thread while a collective runs on another).
/// Shared by the segment and the symmetric_memory objects, so either may go
/// first.
class shm_window_registry {
public:
  /// The number of windows ever created (the last id handed out).
  std::uint64_t created() const noexcept { return created_.load(std::memory_order_acquire); }
  /// The id the next window takes (created() + 1; not yet taken).
  std::uint64_t next_id() const noexcept { return created() + 1; }
  /// Records window `e` (e.id == next_id()).
  void add(const shm_window_entry& e) {
    std::lock_guard<std::mutex> lock(m_);
    windows_.push_back(e);
    created_.store(e.id, std::memory_order_release);
  }
  /// Forgets window `id` (its memory is about to be unmapped here).
  void remove(std::uint64_t id) noexcept {
    std::lock_guard<std::mutex> lock(m_);
    windows_.erase(std::remove_if(windows_.begin(), windows_.end(), [id](const auto& e) { return e.id == id; }),
                   windows_.end());
  }
  /// Where `bytes` bytes at `p` lie in rank `rank`'s region of a window held
  /// now: {id, byte offset in the region}, or {0, 0} when they are not all
  /// inside one.
  std::pair<std::uint64_t, std::uint64_t> find(const void* p, std::size_t bytes, int rank) const noexcept {
    const shm_cover c = cover(p, bytes, rank, 1);
    if (c.id != 0 && c.begin == 0 && c.end == bytes) return {c.id, c.offset};
    return {0, 0};
  }
  /// The largest part of the `bytes` bytes at `p` that lies in rank `rank`'s
  /// region of one window held now (as this rank's user sees the region:
  /// `own` where set), trimmed to whole elements of `elem` bytes counted from
  /// `p`: bytes [begin, end) of the buffer, multiples of elem, from byte
  /// `offset` of the region. {0, 0, 0, 0} when no whole element does.
  shm_cover cover(const void* p, std::size_t bytes, int rank, std::size_t elem) const noexcept {
    std::lock_guard<std::mutex> lock(m_);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    shm_cover best;
    for (const auto& e : windows_) {
      const auto lo = reinterpret_cast<std::uintptr_t>(
          e.own != nullptr ? e.own : e.base + e.stride * static_cast<std::size_t>(rank));
      const std::uintptr_t hi = lo + e.region_bytes;
      if (e.region_bytes == 0 || a >= hi || a + bytes <= lo) continue;
      std::size_t b = a >= lo ? 0 : static_cast<std::size_t>(lo - a);
      std::size_t end = a + bytes <= hi ? bytes : static_cast<std::size_t>(hi - a);
      b = (b + elem - 1) / elem * elem;
      end = end / elem * elem;
      if (end > b && end - b > best.end - best.begin) best = {e.id, a + b - lo, b, end};
    }
    return best;
  }
  /// Rank `rank`'s byte `offset` in window `id`, or nullptr when this rank
  /// does not hold that window or the `bytes` from there leave the region
  /// (for a registered window, whose ranks' regions hold different byte
  /// counts, the stride).
  std::byte* address(std::uint64_t id, int rank, std::uint64_t offset, std::size_t bytes) const noexcept {
    std::lock_guard<std::mutex> lock(m_);
    for (const auto& e : windows_)
      if (e.id == id) {
        const std::size_t limit = e.own != nullptr ? e.stride : e.region_bytes;
        if (offset > limit || bytes > limit - offset) return nullptr;
        return e.base + e.stride * static_cast<std::size_t>(rank) + offset;
      }
    return nullptr;
  }

private:
  mutable std::mutex m_;
  std::vector<shm_window_entry> windows_;
  std::atomic<std::uint64_t> created_{0};
};

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
  /// This rank's chooser of how the two-shot all-reduce writes its buffers
  /// (rank-local, not in the segment; rank 0's decides for all and publishes
  /// in its control line's store_mode; one shm collective at a time uses it).
  segment_store_tuner& store_tuner() const noexcept { return store_tuner_; }
  /// The windows of symmetric memory this rank holds over the segment.
  const std::shared_ptr<shm_window_registry>& windows() const noexcept { return windows_; }
  /// Rank p's control line.
  shm_control& control(int p) const noexcept { return *reinterpret_cast<shm_control*>(bases_[static_cast<std::size_t>(p)]); }
  /// Rank p's data buffer b (0 or 1).
  std::byte* buffer(int p, int b) const noexcept {
    return bases_[static_cast<std::size_t>(p)] + sizeof(shm_control) + static_cast<std::size_t>(b) * slot_bytes_;
  }
  /// Faults in every page of the segment in this process (before any
  /// collective runs on it: the transports call it while setting the segment
  /// up): writes this rank's own buffers (only it writes them) and reads
  /// every peer's, so the first collectives at each size do not pay a page
  /// fault per page they touch (a few microseconds each).
  void prefault() const noexcept {
    for (int p = 0; p < size(); ++p) shm_touch_pages(buffer(p, 0), 2 * slot_bytes_, p == rank_);
  }
  /// Zeroes this rank's control line (before first use; callers synchronize after).
  void reset_own() const noexcept {
    control(rank_).step.store(0, std::memory_order_relaxed);
    control(rank_).sleepers.store(0, std::memory_order_relaxed);
    control(rank_).abort.store(0, std::memory_order_relaxed);
    control(rank_).left.store(0, std::memory_order_relaxed);
    control(rank_).fp_version.store(0, std::memory_order_relaxed);
    control(rank_).store_mode.store(0, std::memory_order_relaxed);
  }
  /// Sets every rank's abort word (`why`: shm_abort_failure, a collective on
  /// this segment failed, the default; shm_abort_close, this rank closed its
  /// transport, after mark_left) and wakes every waiter asleep on any rank's
  /// step counter, so they see it now.
  void abort_all(std::uint32_t why = shm_abort_failure) const noexcept {
    for (int p = 0; p < size(); ++p) control(p).abort.fetch_or(why, std::memory_order_seq_cst);
    for (int p = 0; p < size(); ++p)
      if (control(p).sleepers.load(std::memory_order_seq_cst) != 0) shm_futex_wake(shm_futex_word(control(p).step));
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
  /// Marks this rank as gone by a clean close of its transport (before
  /// abort_all(shm_abort_close)): what it sent stays readable, a wait on it
  /// fails, and it is not an ended peer (ended_peer) of the others.
  void mark_left() const noexcept { control(rank_).left.store(1, std::memory_order_seq_cst); }
  /// Whether rank p closed its transport cleanly (mark_left).
  bool left(int p) const noexcept { return control(p).left.load(std::memory_order_acquire) != 0; }
  /// After the abort words were set: whether a wait on rank p may still
  /// complete, because every abort so far came from clean closes of other
  /// ranks (none from a failure) and p has neither closed nor ended. (A rank
  /// that finished its last collective and closed must not fail two other
  /// ranks still finishing theirs: test_gloo_node "sums" with 3 ranks.)
  bool peer_still_in(int p) const noexcept;
  /// The first other rank whose process has ended (process_ended over the
  /// pids of the control lines; `zombies`: unreaped ones too) without
  /// closing its transport first (left), or -1 (also where ranks are
  /// threads: pid 0).
  int ended_peer(bool zombies) const noexcept;
  /// The first other rank that published a different call than `mine` at
  /// mine's sequence number and stream (what it runs is put in `theirs`),
  /// or -1 (also when `mine` is invalid).
  int other_call(const fingerprint& mine, fingerprint& theirs) const noexcept {
    if (!mine.valid) return -1;
    for (int p = 0; p < size(); ++p) {
      if (p == rank_) continue;
      theirs = published(p);
      if (theirs.valid && theirs.seq == mine.seq && theirs.stream == mine.stream && !theirs.same_call(mine)) return p;
    }
    return -1;
  }
  /// Guards against two threads running shm collectives on one rank at once.
  std::atomic<bool>& busy() noexcept { return busy_; }

private:
  int rank_ = 0;
  std::vector<std::byte*> bases_;
  mutable segment_store_tuner store_tuner_;
  std::shared_ptr<shm_window_registry> windows_ = std::make_shared<shm_window_registry>();
  std::size_t slot_bytes_ = 0;
  std::atomic<bool> busy_{false};
};

/// True when process `pid` has ended: it no longer exists (kill(pid, 0):
/// ESRCH), or, with `zombie_too`, it has exited but its parent has not
/// reaped it yet (state 'Z' in /proc/<pid>/stat; a launcher that polls its
/// children slowly leaves a dead rank a zombie for a while). Never throws.
inline bool process_ended(int pid, bool zombie_too) noexcept {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  if (!zombie_too) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  std::FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[512];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // "pid (comm) S ...": the state follows the last ')' (comm may hold one)
  const char* close = std::strrchr(buf, ')');
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

inline bool shm_segment::peer_still_in(int p) const noexcept {
  return (control(rank_).abort.load(std::memory_order_acquire) & shm_abort_failure) == 0 && !left(p) &&
         !process_ended(control(p).pid.load(std::memory_order_relaxed), false);
}

inline int shm_segment::ended_peer(bool zombies) const noexcept {
  for (int p = 0; p < size(); ++p)
    if (p != rank_ && !left(p) && process_ended(control(p).pid.load(std::memory_order_relaxed), zombies)) return p;
  return -1;
}

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

/// True when `value`, an Open MPI boolean MCA parameter's text, says yes:
/// 1 (any non-zero number), true, yes or on in any case; false for null,
/// empty, 0, false, no, off or anything else.
inline bool mca_bool_true(const char* value) noexcept {
  if (!value || !*value) return false;
  for (const char* yes : {"true", "yes", "on"})
    if (strcasecmp(value, yes) == 0) return true;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  return end && *end == '\0' && n != 0;
}

/// True when the launcher told this job's ranks to give up the core while
/// they wait: Open MPI's mpi_yield_when_idle (`mpirun --mca
/// mpi_yield_when_idle 1`, which reaches the ranks as
/// OMPI_MCA_mpi_yield_when_idle). It is how a user says that the ranks share
/// cores with ranks or work the node's core count does not show:
/// scripts/cluster.sh sets it, its nodes sharing one machine's cores. Read
/// once per process.
inline bool launcher_asks_yield() noexcept {
  static const bool v = mca_bool_true(std::getenv("OMPI_MCA_mpi_yield_when_idle"));
  return v;
}

/// True when the ranks of this node share cores: a world of `world_size`
/// ranks has more ranks than the machine has cores (hardware_concurrency;
/// the same on every rank of a node), or the launcher asked ranks to yield
/// when idle (launcher_asks_yield; the same environment on every rank).
inline bool shm_oversubscribed(int world_size) noexcept {
  static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<unsigned>(world_size) > cores || launcher_asks_yield();
}

/// How many pause-spins a wait does before it yields: 256 when the ranks
/// have cores of their own, none when they share them (`share_cores`): a
/// spinning rank would keep the core from the rank it waits for. On the
/// emulated 2x2 cluster (4 ranks on 2 cores, each node's 2 ranks seeing 2
/// cores) the spins cost the hierarchy's small path about 4 us of its
/// 25-30 us (benchmarks/results/2026-11-26-cluster-layouts.md).
inline int shm_spins_before_yield(bool share_cores) noexcept { return share_cores ? 0 : 256; }

/// shm_spins_before_yield for a world of `world_size` ranks on this node
/// (shm_oversubscribed).
inline int shm_spin_count(int world_size) noexcept { return shm_spins_before_yield(shm_oversubscribed(world_size)); }

/// How many yielding polls a wait does before it sleeps on the peer's futex:
/// DPKIT_SHM_YIELDS if set (a tuning knob), else 2048 (0.5-5 ms of yields).
/// Measured on 2 cores (docs/tuning.md "Waits"): a futex wake-up takes
/// 10-30 us there, a yield that hands the core to the awaited rank about
/// 1 us, so sleeping sooner made 3-4 oversubscribed ranks slower (8 B: 28 us
/// when sleeping at once, 2-4 us with 16 or more yields); the futex is for
/// waits that last (a late rank), which no longer burn a core.
inline unsigned shm_yield_polls() noexcept {
  static const long from_env = [] {
    const char* s = std::getenv("DPKIT_SHM_YIELDS");
    return s && *s ? std::strtol(s, nullptr, 10) : -1L;
  }();
  return from_env >= 0 ? static_cast<unsigned>(from_env) : 2048u;
}

/// Waits until `ready()`: `spins` pause-spins, then polls with yields, then
/// (after `yield_polls` of those, and only with `word`) sleeps on the futex
/// over `word`'s step counter (shm_publish_step and abort_all wake it; each
/// sleep at most `sleep_us`, 50 us sleeps without `word`). `check()` (which
/// throws on deadline, abort or peer failure) runs every 16 polls and after
/// every sleep. With more ranks than cores the caller passes no spins (a
/// spinning rank would keep the core from the rank it waits for).
template <class Ready, class Check>
void shm_wait(Ready&& ready, Check&& check, int spins = 256, shm_control* word = nullptr,
              unsigned yield_polls = shm_yield_polls(), long sleep_us = 1000) {
  for (int i = 0; i < spins; ++i) {
    if (ready()) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  const auto start = std::chrono::steady_clock::now();
  for (unsigned polls = 1;; ++polls) {
    if (ready()) return;
    if ((polls & 15u) == 0) check();
    if (word && polls >= yield_polls) {
      word->sleepers.fetch_add(1, std::memory_order_seq_cst);
      // the word as it is now, then one more look: a store after this load
      // changes the futex word (the wait returns at once) and sees sleepers
      const auto low = static_cast<std::uint32_t>(word->step.load(std::memory_order_seq_cst));
      if (!ready()) shm_futex_wait(shm_futex_word(word->step), low, sleep_us);
      word->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      check();
      continue;
    }
    if ((polls & 15u) == 0 && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(2)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
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
