// dpkit internals: point-to-point messages between the processes of one node
// through shared memory, for transports whose ranks meet through a store
// (gloo_transport): the role Open MPI's vader BTL plays for dpkit::mpi. Not
// for users.
//
// Memory. An area after the ranks' regions of the node's segment
// (store_bootstrap.hpp maps both at once): one doorbell line per rank, then
// one ring per ordered pair of ranks (sender s, receiver r; the pair's two
// directions are two rings), each a control line (tail, written by the
// receiver only) and `ring_bytes` of data (a power of two,
// shm_p2p_ring_bytes).
//
// Messages. A message is cut into fragments; each fragment is a 16-byte
// header (tag, fragment bytes, message bytes) and its payload, padded to 16
// bytes, written at the sender's head. The header's last word (message
// bytes with shm_p2p_published set) is written last (release), after the
// payload and after the sender cleared the same word of the next header's
// place: the receiver polls the header word at its tail, so the line that
// tells it a fragment arrived is the fragment's own first line, as Open
// MPI's vader polls its fast boxes (a separate head counter cost a second
// dependent cache miss per message: the receiver first read the counter,
// then the header it pointed to), and it stops at the cleared word, never
// reading what an earlier lap left beyond the last fragment. After copying a
// fragment out, the receiver advances tail (release). The sender reads tail
// only when the value it saw last leaves too little room (one cache line
// fewer crossing the cores per message); it keeps 16 bytes free for the
// next header's cleared word.
// The sends to one peer leave in posting order, one message after the other,
// so a pair's messages with one tag arrive in posting order (MPI's
// non-overtaking rule, the transport concept's). A message whose receive is
// not posted yet is copied to a buffer of its own (MPI's unexpected queue)
// so the ring never stops behind it; a receive posted later takes it from
// there, up to a budget (four rings' worth per peer): past it the next
// message waits in the ring until its receive is posted, so a sender cannot
// run arbitrarily far ahead of its receiver (flow control; a receiver that
// waits for a later message of that peer before posting the earlier ones'
// receives then waits until its deadline, which no dpkit collective does).
// Nothing moves by itself: progress() (called by every wait and test
// of any request) drains the incoming rings and fills the outgoing ones.
//
// Large messages (at least shm_p2p_cma_bytes(), 64 KiB by default) are
// copied once instead of twice: the sender writes a request-to-send fragment
// (the buffer's address in its process) and keeps the send pending; the
// receiver, once the message is matched, copies the bytes straight out of the
// sender's memory with process_vm_readv (Linux cross-memory attach, as
// Open MPI's vader does) and answers with an acknowledgement fragment on the
// reverse ring, which completes the send. The read runs in progress(), after
// this rank's queued sends have gone out, never inside post_recv: a receive
// posted before its send (every exchange of two ranks, the ring
// collectives' steps) otherwise read the peer's message before its own
// request to send left, and the peer's read of it waited for that one to
// end (the two reads took turns: a 2-rank 4 MiB exchange 2x slower than
// Open MPI's). A sender uses this only after it
// has read its peer's doorbell line the same way (the peers may read each
// other's memory: same user, no ptrace restriction); DPKIT_SHM_CMA=0 turns
// it off.
//
// Sleeping. A wait that lasts sleeps on its rank's doorbell (a futex); a
// sender that filled a ring, or a receiver that freed one, rings the peer's
// doorbell when it has sleepers.
#pragma once

#include "../../core/errors.hpp"
#include "p2p_engine.hpp"
#include "shm_segment.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/uio.h> // process_vm_readv
#include <unistd.h>
#endif
#include <cerrno>
#include <cstdlib>

namespace dpkit::detail {

/// The control part of one directed ring (sender s to receiver r): tail
/// (the bytes the receiver has consumed, ever) on a cache line of its own.
/// What the sender has written is told by the fragments' headers
/// themselves (shm_p2p_published).
struct alignas(64) shm_p2p_ring_ctl {
  std::atomic<std::uint64_t> tail{0};
  char pad[56];
};
static_assert(sizeof(shm_p2p_ring_ctl) == 64);

/// A rank's doorbell: `ring` changes whenever a peer wrote to this rank or
/// freed space this rank waits for, while `sleepers` is non-zero (the futex
/// word is `ring`).
struct alignas(64) shm_p2p_bell {
  std::atomic<std::uint32_t> ring{0};
  std::atomic<std::uint32_t> sleepers{0};
  /// The owner's process id and the address of this line in the owner's
  /// address space (set when its engine starts), so a peer can check that
  /// it may read the owner's memory (process_vm_readv).
  std::atomic<std::int32_t> pid{0};
  std::atomic<std::uint64_t> self{0};
  char pad[40];
};
static_assert(sizeof(shm_p2p_bell) == 64);

/// The header of one fragment in a ring. `frag` holds the fragment's kind
/// in its top 4 bits (shm_p2p_kind) and its payload bytes below.
struct shm_p2p_header {
  std::int32_t tag;
  std::uint32_t frag;   // kind << 28 | payload bytes of this fragment
  std::uint64_t msg;    // bytes of the whole message
};
static_assert(sizeof(shm_p2p_header) == 16);

/// The bit of a header's `msg` word that says the fragment is complete in
/// the ring (its sender writes the word last, with release); a word without
/// it (zero: cleared by the sender, or a fresh ring) ends what the receiver
/// may read.
inline constexpr std::uint64_t shm_p2p_published = std::uint64_t{1} << 63;
// The header word is shared between processes: its atomic operations must
// not go through a lock of one process's address space.
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free);

/// Kinds of fragment: message bytes; a request to send (payload: the
/// send's id and the buffer's address in the sender; the receiver reads the
/// message from there); an acknowledgement of one (payload: the id and 0,
/// or the errno of the receiver's failed read).
enum shm_p2p_kind : std::uint32_t { shm_p2p_data = 0, shm_p2p_rts = 1, shm_p2p_ack = 2 };
inline constexpr std::uint32_t shm_p2p_len_mask = (1u << 28) - 1;

/// The single-copy threshold when DPKIT_SHM_CMA_BYTES is unset (bytes; as
/// measured in docs/tuning.md).
inline constexpr std::size_t shm_p2p_cma_default_bytes = std::size_t{64} << 10;

/// The single-copy threshold from DPKIT_SHM_CMA (`off`: "0" turns the
/// single copy off, "1" or unset keeps it) and DPKIT_SHM_CMA_BYTES (`bytes`:
/// a byte count; unset: 64 KiB, as measured in docs/tuning.md). Returns
/// SIZE_MAX when off.
/// @throws dpkit::invalid_argument naming the variable and the value when a
///         value is malformed (never a silent fallback to the default).
inline std::size_t parse_shm_cma_bytes(const char* off, const char* bytes) {
  if (off && *off) {
    if (std::string(off) == "0") return SIZE_MAX;
    if (std::string(off) != "1")
      throw invalid_argument(std::string("DPKIT_SHM_CMA: expected 0 (off) or 1 (on), got '") + off + "'");
  }
  if (bytes && *bytes) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(bytes, &end, 10);
    if (!end || *end != '\0' || bytes[0] == '-' || bytes[0] == '+' || errno == ERANGE)
      throw invalid_argument(std::string("DPKIT_SHM_CMA_BYTES: expected a byte count, got '") + bytes + "'");
    return static_cast<std::size_t>(n);
  }
  return shm_p2p_cma_default_bytes;
}

/// Messages of at least this many bytes are read by the receiver straight
/// from the sender's memory (one copy): parse_shm_cma_bytes of
/// DPKIT_SHM_CMA and DPKIT_SHM_CMA_BYTES, read once per process (a malformed
/// value throws at every call, when a transport is made).
/// @throws dpkit::invalid_argument on a malformed value.
inline std::size_t shm_p2p_cma_bytes() {
  static const std::size_t v = parse_shm_cma_bytes(std::getenv("DPKIT_SHM_CMA"), std::getenv("DPKIT_SHM_CMA_BYTES"));
  return v;
}

/// Reads `bytes` at address `remote` of process `pid` into `local` (all
/// of it, in as many calls as it takes). Returns 0, or the errno of the
/// failure (ENOSYS where there is no process_vm_readv).
inline int shm_cma_read(int pid, std::uint64_t remote, std::byte* local, std::size_t bytes) noexcept {
#if defined(__linux__)
  std::size_t done = 0;
  while (done < bytes) {
    iovec l{local + done, bytes - done};
    iovec r{reinterpret_cast<void*>(static_cast<std::uintptr_t>(remote + done)), bytes - done};
    const ssize_t n = ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    done += static_cast<std::size_t>(n);
  }
  return 0;
#else
  (void)pid, (void)remote, (void)local, (void)bytes;
  return ENOSYS;
#endif
}

/// Data bytes of each ring for `size` ranks on a node (a power of two; 0 for
/// one rank). Ranks with cores of their own (`share_cores` false): 8 KiB,
/// halved while the rings of every ordered pair would take more than 64 MiB,
/// never below 4 KiB. A ring that small stays in the two cores' L1 caches:
/// the sender writes lines it wrote a lap ago (the receiver only shares
/// them) instead of lines gone to the receiver's cache or beyond, and
/// messages past a quarter ring go in fragments that pipeline. Measured
/// against 256 KiB rings in the same two processes (the 2-rank tree's
/// round trip, 2 vCPUs of an AMD EPYC VM, record
/// 2026-11-28-shm-small-rings): 512 B 1.21x faster, 2 KiB 1.19x, 8 KiB
/// 1.13x, 32 KiB 1.41x, 60 KiB 1.51x; 16 KiB rings gained 4% at most (two
/// of them fill a 32 KiB L1), 4 KiB ones lost 12-17% at 32-60 KiB. Ranks
/// that share cores (`share_cores`, see shm_oversubscribed): 256 KiB,
/// halved while the rings would take more than 64 MiB (a container's
/// /dev/shm is often 64 MiB in all), never below 16 KiB: a sender there
/// runs ahead while its receiver is off the core, and an 8 KiB ring made a
/// 32 KiB message 3.3x slower (a switch of core per ring).
inline std::size_t shm_p2p_ring_bytes(int size, bool share_cores = false) noexcept {
  if (size < 2) return 0;
  const std::size_t pairs = static_cast<std::size_t>(size) * static_cast<std::size_t>(size - 1);
  std::size_t r = std::size_t{share_cores ? 256u : 8u} << 10;
  const std::size_t floor = std::size_t{share_cores ? 16u : 4u} << 10;
  while (r > floor && r * pairs > (std::size_t{64} << 20)) r /= 2;
  return r;
}

/// Whether `bytes` can be the ring size of an area (a value read from
/// another process): a power of two from 4 KiB to 16 MiB.
inline bool shm_p2p_ring_bytes_valid(std::size_t bytes) noexcept {
  return bytes >= (std::size_t{4} << 10) && bytes <= (std::size_t{16} << 20) && (bytes & (bytes - 1)) == 0;
}

/// Early-message buffers (see shm_p2p: a message whose receive is not
/// posted yet) an engine allocates and faults in when it starts, and the
/// bytes of each (the default single-copy threshold): the messages below it
/// that a collective can have in flight ahead of their receives (a ring's
/// pipelined steps, a tree's two children) then take buffers that are
/// already in this process's page table. Larger early messages (the single
/// copy off, or DPKIT_SHM_CMA_BYTES raised) allocate their own, as before. Allocated on first use instead,
/// each new size's first early message paid malloc and a page fault per
/// fresh page (two 10-15 us faults in the first timed iterations of
/// allreduce_perf's 2 KiB ring launched from a store, the VM of
/// docs/tuning.md), as Open MPI's vader avoids with free lists of
/// fragments allocated at start.
inline constexpr int shm_p2p_early_buffers = 4;
inline constexpr std::size_t shm_p2p_early_buffer_bytes = shm_p2p_cma_default_bytes;

/// Bytes of the point-to-point area for `size` ranks with rings of
/// `ring_bytes` each (a multiple of 4096; 0 for one rank): the doorbells,
/// then each ordered pair's ring.
inline std::size_t shm_p2p_area_bytes(int size, std::size_t ring_bytes) noexcept {
  if (size < 2) return 0;
  const std::size_t pairs = static_cast<std::size_t>(size) * static_cast<std::size_t>(size - 1);
  const std::size_t bytes = static_cast<std::size_t>(size) * sizeof(shm_p2p_bell) +
                            pairs * (sizeof(shm_p2p_ring_ctl) + ring_bytes);
  return (bytes + 4095) / 4096 * 4096;
}

/// One pending send or receive over shared memory (p2p_engine.hpp).
using shm_p2p_op = p2p_op;

/// The point-to-point engine of one rank over the area (see the file
/// comment). Thread-safe: one mutex guards its queues (a rank's user thread
/// and its communication thread may both wait).
class shm_p2p final : public p2p_engine {
public:
  /// Rank `rank` of `size` on the area at `area` with rings of `ring_bytes`
  /// (shm_p2p_area_bytes(size, ring_bytes) bytes, 64-byte aligned,
  /// zero-filled by its creator; every rank of the area passes the same
  /// `ring_bytes`, a shm_p2p_ring_bytes_valid value); messages of at least
  /// `cma_bytes` bytes are read by the receiver from this process's memory
  /// (SIZE_MAX: never). With peers it allocates and faults in
  /// shm_p2p_early_buffers early-message buffers (256 KiB in all).
  /// @throws std::bad_alloc when those cannot be allocated.
  shm_p2p(int rank, int size, std::byte* area, std::size_t ring_bytes, std::size_t cma_bytes = shm_p2p_cma_bytes())
      : rank_(rank), size_(size), cap_(ring_bytes), early_budget_(4 * shm_p2p_ring_bytes(size, true)), area_(area),
        in_(static_cast<std::size_t>(size)), out_(static_cast<std::size_t>(size)),
        head_(static_cast<std::size_t>(size), 0), tail_(static_cast<std::size_t>(size), 0),
        seen_tail_(static_cast<std::size_t>(size), 0), cma_(static_cast<std::size_t>(size), 0),
        awaiting_(static_cast<std::size_t>(size)), acks_(static_cast<std::size_t>(size)),
        next_id_(static_cast<std::size_t>(size), 0), cma_bytes_(cma_bytes) {
    shm_p2p_bell& b = bell(rank_);
#if defined(__linux__)
    b.pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_relaxed);
#endif
    b.self.store(reinterpret_cast<std::uintptr_t>(&b), std::memory_order_release);
    for (int i = 0; size > 1 && i < shm_p2p_early_buffers; ++i) {
      std::unique_ptr<std::byte[]> buf(new std::byte[shm_p2p_early_buffer_bytes]);
      std::memset(buf.get(), 0, shm_p2p_early_buffer_bytes); // every page faulted in now
      spare_.emplace_back(shm_p2p_early_buffer_bytes, std::move(buf));
    }
  }

  /// The capacities (bytes) of the early-message buffers this engine holds
  /// for reuse, none of them lent to a message now (diagnostics and tests).
  std::vector<std::size_t> spare_capacities() {
    std::lock_guard lk(mu_);
    std::vector<std::size_t> caps;
    for (const auto& s : spare_) caps.push_back(s.first);
    return caps;
  }

  /// Where the ring from rank `s` to rank `r` starts (its control part, then
  /// its data) in the area of `size` ranks with rings of `ring_bytes` at
  /// `area`: the doorbells first, then the rings of each sender in receiver
  /// order (no ring to itself).
  static std::byte* ring_at(std::byte* area, int size, std::size_t ring_bytes, int s, int r) noexcept {
    const std::size_t k = static_cast<std::size_t>(s) * static_cast<std::size_t>(size - 1) +
                          static_cast<std::size_t>(r < s ? r : r - 1);
    return area + static_cast<std::size_t>(size) * sizeof(shm_p2p_bell) + k * (sizeof(shm_p2p_ring_ctl) + ring_bytes);
  }

  /// Faults in, in this process, every page of rank `rank`'s rings in the
  /// area of `size` ranks with rings of `ring_bytes`: writes its outgoing
  /// rings' data (only it writes them; nothing is in them yet) and reads its
  /// incoming ones. Called while
  /// the segment is set up (store_map_segment), before any engine runs: the
  /// first message through a page otherwise pays a page fault (a few
  /// microseconds each, tens per ring), which made the first calls at each
  /// message size several times slower. Every page the data overlaps,
  /// including the last one it shares with the next ring's control part
  /// (shm_touch_pages): a ring's first wrap faulted on it inside a timed
  /// collective (allreduce_perf's tree at 2 KiB, 13 us once per process).
  static void prefault(std::byte* area, int rank, int size, std::size_t ring_bytes) noexcept {
    if (size < 2) return;
    auto data = [&](int s, int r) { return ring_at(area, size, ring_bytes, s, r) + sizeof(shm_p2p_ring_ctl); };
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      shm_touch_pages(data(rank, p), ring_bytes, true);
      shm_touch_pages(data(p, rank), ring_bytes, false);
    }
  }

  /// Constructs the doorbells and ring controls of an area for `size` ranks
  /// with rings of `ring_bytes` (by its creator, before any other rank maps
  /// it).
  static void init_area(std::byte* area, int size, std::size_t ring_bytes) noexcept {
    if (size < 2) return;
    for (int p = 0; p < size; ++p) new (area + static_cast<std::size_t>(p) * sizeof(shm_p2p_bell)) shm_p2p_bell{};
    for (int s = 0; s < size; ++s)
      for (int r = 0; r < size; ++r)
        if (r != s) {
          std::byte* c = ring_at(area, size, ring_bytes, s, r);
          new (c) shm_p2p_ring_ctl{};
          // the first header's word: nothing published (a segment's memory
          // is zero-filled when created; this holds for any memory)
          std::memset(c + sizeof(shm_p2p_ring_ctl), 0, sizeof(shm_p2p_header));
        }
  }
  shm_p2p(const shm_p2p&) = delete;
  shm_p2p& operator=(const shm_p2p&) = delete;

  int rank() const noexcept { return rank_; }
  const char* medium() const noexcept override { return "shared memory"; }
  int size() const noexcept { return size_; }

  /// Queues a send of `bytes` at `data` to `peer` with `tag` and copies as
  /// much of it into the ring as fits now (a small message leaves at once).
  std::shared_ptr<shm_p2p_op> post_send(const std::byte* data, std::size_t bytes, int peer, int tag) override {
    auto op = make(true, const_cast<std::byte*>(data), bytes, peer, tag);
    std::lock_guard lk(mu_);
    if (!put_whole(peer, *op)) {
      out_[static_cast<std::size_t>(peer)].push_back(op);
      pump_out(peer);
    }
    return op;
  }
  /// Posts a receive of exactly `bytes` into `data` from `peer` with `tag`:
  /// takes an unexpected message of that tag that arrived earlier (the
  /// oldest), else waits for the next one.
  std::shared_ptr<shm_p2p_op> post_recv(std::byte* data, std::size_t bytes, int peer, int tag) override {
    auto op = make(false, data, bytes, peer, tag);
    std::lock_guard lk(mu_);
    incoming& s = in_[static_cast<std::size_t>(peer)];
    for (auto it = s.early.begin(); it != s.early.end(); ++it) {
      early_msg& u = **it;
      if (u.tag != tag) continue;
      const bool receiving = s.active && s.target_ux == &u;
      if (u.bytes != bytes) {
        fail_op(*op, length_text(*op, u.bytes));
        if (u.rts) { // unread: the send completes
          acks_[static_cast<std::size_t>(peer)].push_back({u.id, 0, nullptr});
          pump_out(peer);
        }
        if (receiving) {
          s.target_ux = nullptr;
          s.discard = true;
        }
      } else if (u.rts) {
        queue_read(op, peer, u.id, u.addr);
      } else {
        if (u.got) std::memcpy(op->data, u.data.get(), u.got);
        op->moved = u.got;
        if (receiving) {
          s.target_ux = nullptr;
          s.target_op = op;
        } else {
          op->state.store(shm_p2p_op::done, std::memory_order_release);
        }
      }
      if (!u.rts) s.early_bytes -= u.bytes;
      recycle(std::move(u.data), u.cap);
      s.early.erase(it);
      pump_in(peer); // a message held back by the budget may go now
      return op;
    }
    s.posted.push_back(op);
    pump_in(peer);
    return op;
  }

  /// Moves what can move: drains every incoming ring (into posted receives
  /// or unexpected buffers) and fills every outgoing ring from the queued
  /// sends. Returns true when anything moved.
  bool progress() override {
    std::lock_guard lk(mu_);
    bool moved = false;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      moved |= pump_in(p);
      moved |= pump_out(p);
    }
    // the matched requests to send are read last: this rank's own requests
    // to send have left by now, so its peers read them meanwhile
    while (!reads_.empty()) {
      const pending_read d = std::move(reads_.front());
      reads_.pop_front();
      read_rts(d.recv, d.peer, d.id, d.addr);
      moved = true;
    }
    return moved;
  }

  /// Sleeps on this rank's doorbell for at most `us` microseconds unless a
  /// ring has something for this rank now (callers re-check afterwards).
  void sleep(long us) override {
    shm_p2p_bell& b = bell(rank_);
    b.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t v = b.ring.load(std::memory_order_seq_cst);
    if (!ready()) shm_futex_wait(reinterpret_cast<std::uint32_t*>(&b.ring), v, us);
    b.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }

  int probe(int tag, int from) override {
    std::lock_guard lk(mu_);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) pump_in(p);
    for (int k = 0; k < size_; ++k) {
      const int p = (from + k) % size_;
      if (p == rank_ || p < 0) continue;
      const incoming& s = in_[static_cast<std::size_t>(p)];
      for (const auto& u : s.early)
        if (u->tag == tag) return p;
      if (s.held && s.held_tag == tag) return p;
    }
    return -1;
  }

  /// The tag of a message from `peer` that arrived unreceived and belongs to
  /// another collective at the sequence number of `tag` (foreign_tag), or 0.
  int foreign_message(int peer, int tag) override {
    std::lock_guard lk(mu_);
    for (const auto& u : in_[static_cast<std::size_t>(peer)].early)
      if (foreign_tag(tag, u->tag)) return u->tag;
    return 0;
  }

  /// Withdraws `op` if it is still pending (its buffer is never touched
  /// afterwards). Returns true when it was pending (the caller fails the
  /// transport: a half-sent message cannot be taken back).
  bool withdraw(shm_p2p_op& op) override {
    // done and failed are final, and an op in either is no longer touched:
    // a completed request's destructor (every request's) needs no lock
    if (op.state.load(std::memory_order_acquire) != shm_p2p_op::pending) return false;
    std::lock_guard lk(mu_);
    if (op.state.load(std::memory_order_acquire) != shm_p2p_op::pending) return false;
    const auto p = static_cast<std::size_t>(op.peer);
    auto drop = [&](std::deque<std::shared_ptr<shm_p2p_op>>& q) {
      q.erase(std::remove_if(q.begin(), q.end(), [&](const auto& o) { return o.get() == &op; }), q.end());
    };
    if (!op.is_send) {
      for (auto it = reads_.begin(); it != reads_.end(); ++it) {
        if (it->recv.get() != &op) continue;
        acks_[p].push_back({it->id, 0, nullptr}); // unread: the send completes
        reads_.erase(it);
        pump_out(op.peer);
        break;
      }
    }
    if (op.is_send) {
      drop(out_[p]);
      drop(awaiting_[p]); // the receiver may still read the buffer: the caller fails the transport
    } else {
      drop(in_[p].posted);
      if (in_[p].active && in_[p].target_op.get() == &op) {
        in_[p].target_op.reset();
        in_[p].discard = true;
      }
    }
    fail_op(op, op.describe(rank_) + " was abandoned before it completed");
    return true;
  }

  /// Fails every pending operation with `why` (the transport failed): their
  /// waits end, and no buffer of theirs is touched afterwards.
  void fail_all(const std::string& why) override {
    std::lock_guard lk(mu_);
    fail_unlocked_all(why);
  }

private:
  struct early_msg {
    int tag = 0;
    std::size_t bytes = 0, got = 0;
    std::unique_ptr<std::byte[]> data;
    std::size_t cap = 0;          // bytes data holds (a recycled buffer may hold more)
    bool rts = false;             // a request to send: the bytes stay in the sender
    std::uint64_t id = 0, addr = 0;
  };
  struct incoming {
    std::deque<std::shared_ptr<shm_p2p_op>> posted;      // unmatched receives, in posting order
    std::deque<std::unique_ptr<early_msg>> early;     // messages that arrived first, in order
    bool active = false;                                 // a message is being received
    int tag = 0;
    std::size_t msg = 0, got = 0;
    std::size_t early_bytes = 0; // bytes of the data messages in `early`
    std::shared_ptr<shm_p2p_op> target_op; // ... into this receive,
    early_msg* target_ux = nullptr;       // ... or this buffer,
    bool discard = false;                  // ... or nowhere (its receive failed or was withdrawn)
    bool held = false;                     // the next message (tag held_tag) waits in the ring (budget)
    int held_tag = 0;
  };

  static std::shared_ptr<shm_p2p_op> make(bool is_send, std::byte* data, std::size_t bytes, int peer, int tag) {
    return make_p2p_op(is_send, data, bytes, peer, tag, "shared memory");
  }
  static void fail_op(shm_p2p_op& op, const std::string& why) { fail_p2p_op(op, why); }
  std::string length_text(const shm_p2p_op& op, std::size_t sent) const { return p2p_length_text(op, rank_, sent); }
  static std::size_t pad16(std::size_t n) noexcept { return (n + 15) / 16 * 16; }

  shm_p2p_bell& bell(int p) const noexcept { return reinterpret_cast<shm_p2p_bell*>(area_)[p]; }
  // The ring from rank s to rank r.
  shm_p2p_ring_ctl& ctl(int s, int r) const noexcept {
    return *reinterpret_cast<shm_p2p_ring_ctl*>(ring_at(area_, size_, cap_, s, r));
  }
  std::byte* ring_data(int s, int r) const noexcept {
    return reinterpret_cast<std::byte*>(&ctl(s, r)) + sizeof(shm_p2p_ring_ctl);
  }
  void ring_bell(int p) noexcept {
    shm_p2p_bell& b = bell(p);
    std::atomic_thread_fence(std::memory_order_seq_cst); // the header/tail store before the look at sleepers
    if (b.sleepers.load(std::memory_order_seq_cst) != 0) {
      b.ring.fetch_add(1, std::memory_order_seq_cst);
      shm_futex_wake(reinterpret_cast<std::uint32_t*>(&b.ring));
    }
  }
  // Whether a ring has something for this rank: an incoming fragment, or
  // space freed in a ring a queued send waits on.
  bool ready() {
    std::lock_guard lk(mu_);
    if (!reads_.empty()) return true;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const auto i = static_cast<std::size_t>(p);
      if (header_word(ring_data(p, rank_), tail_[i]).load(std::memory_order_acquire) & shm_p2p_published) return true;
      if ((!out_[i].empty() || !acks_[i].empty()) &&
          ctl(rank_, p).tail.load(std::memory_order_acquire) != seen_tail_[i])
        return true;
    }
    return false;
  }

  // Copies `n` bytes between the ring (at stream offset `pos`) and `buf`.
  void ring_read(const std::byte* ring, std::uint64_t pos, std::byte* buf, std::size_t n) const noexcept {
    const std::size_t at = static_cast<std::size_t>(pos & (cap_ - 1));
    const std::size_t first = std::min(n, cap_ - at);
    if (buf) {
      std::memcpy(buf, ring + at, first);
      if (n > first) std::memcpy(buf + first, ring, n - first);
    }
  }
  // The `msg` word of the header at stream offset `pos` (16-byte aligned: a
  // header never wraps) of a ring: written last by the sender (release),
  // polled by the receiver (acquire).
  std::atomic_ref<std::uint64_t> header_word(const std::byte* ring, std::uint64_t pos) const noexcept {
    auto* w = const_cast<std::uint64_t*>(reinterpret_cast<const std::uint64_t*>(
        ring + static_cast<std::size_t>(pos & (cap_ - 1)) + offsetof(shm_p2p_header, msg)));
    return std::atomic_ref<std::uint64_t>(*w);
  }
  void ring_write(std::byte* ring, std::uint64_t pos, const std::byte* buf, std::size_t n) const noexcept {
    const std::size_t at = static_cast<std::size_t>(pos & (cap_ - 1));
    const std::size_t first = std::min(n, cap_ - at);
    std::memcpy(ring + at, buf, first);
    if (n > first) std::memcpy(ring, buf + first, n - first);
  }

  // Writes one fragment at `head` of the ring to `p` and publishes it (the
  // caller checked the space, 16 bytes past the fragment included): the
  // payload, the next header's word cleared, then this header, its `msg`
  // word last (release).
  void put(std::byte* ring, std::uint64_t& head, int tag, std::uint32_t kind, const std::byte* payload,
           std::size_t len, std::uint64_t msg) noexcept {
    if (len) ring_write(ring, head + 16, payload, len);
    const std::uint64_t next = head + 16 + pad16(len);
    header_word(ring, next).store(0, std::memory_order_relaxed); // ordered before the release below
    const shm_p2p_header h{tag, (kind << 28) | static_cast<std::uint32_t>(len), 0};
    ring_write(ring, head, reinterpret_cast<const std::byte*>(&h), offsetof(shm_p2p_header, msg));
    header_word(ring, head).store(msg | shm_p2p_published, std::memory_order_release);
    head = next;
  }

  // Whether peer `p` may read this rank's memory (process_vm_readv): tried
  // once on its doorbell line (this rank reads `p`'s; the permission is the
  // same both ways for processes of one user). Unknown (false) until `p`'s
  // engine has started.
  bool single_copy_to(int p) {
    const auto i = static_cast<std::size_t>(p);
    if (cma_[i] == 0) {
      const shm_p2p_bell& b = bell(p);
      const std::uint64_t self = b.self.load(std::memory_order_acquire);
      const int pid = b.pid.load(std::memory_order_relaxed);
      if (self == 0 || pid == 0) return false;
      std::uint64_t seen = 0;
      const int err = shm_cma_read(pid, self + offsetof(shm_p2p_bell, self), reinterpret_cast<std::byte*>(&seen),
                                   sizeof seen);
      cma_[i] = err == 0 && seen == self ? 1 : -1;
    }
    return cma_[i] > 0;
  }

  // Fills the ring to `p`: first the acknowledgements this rank owes `p`,
  // then the queued sends, in order (caller holds mu_).
  bool pump_out(int p) {
    const auto i = static_cast<std::size_t>(p);
    auto& q = out_[i];
    auto& acks = acks_[i];
    if (q.empty() && acks.empty()) return false;
    std::byte* ring = ring_data(rank_, p);
    std::uint64_t head = head_[i];
    auto space = [&] { return space_to(i, head); };
    auto room = [&](std::size_t need) { return room_to(p, head, need); };
    const std::size_t max_frag = cap_ / 4;
    bool moved = false;
    while (!acks.empty() && room(32)) {
      const std::uint64_t payload[2] = {acks.front().id, acks.front().err};
      put(ring, head, 0, shm_p2p_ack, reinterpret_cast<const std::byte*>(payload), sizeof payload, 0);
      // the receive it acknowledges completes only now: a rank that left
      // once its receives were done would otherwise strand the sender
      if (acks.front().recv) {
        int expected = shm_p2p_op::pending; // not if it failed or was withdrawn meanwhile
        acks.front().recv->state.compare_exchange_strong(expected, shm_p2p_op::done, std::memory_order_acq_rel);
      }
      acks.pop_front();
      moved = true;
    }
    while (acks.empty() && !q.empty()) {
      shm_p2p_op& o = *q.front();
      if (!o.started && o.bytes >= cma_bytes_ && single_copy_to(p)) {
        if (!room(32)) break;
        o.id = next_id_[i]++;
        const std::uint64_t payload[2] = {o.id, static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(o.data))};
        put(ring, head, o.tag, shm_p2p_rts, reinterpret_cast<const std::byte*>(payload), sizeof payload, o.bytes);
        o.started = true;
        moved = true;
        awaiting_[i].push_back(q.front()); // done when the receiver acknowledges
        q.pop_front();
        continue;
      }
      const std::size_t remaining = o.bytes - o.moved;
      // a whole fragment (the rest, at most a quarter ring) if it fits after
      // a fresh look at the tail, else one of at least 4 KiB (or the rest),
      // else wait for space
      if (!room(16 + std::min(remaining, max_frag)) && space() < 16 + std::min<std::size_t>(remaining, 4096)) break;
      const std::size_t frag = std::min({remaining, space() - 16, max_frag});
      put(ring, head, o.tag, shm_p2p_data, o.data + o.moved, frag, o.bytes);
      o.moved += frag;
      o.started = true;
      moved = true;
      if (o.moved == o.bytes) {
        o.state.store(shm_p2p_op::done, std::memory_order_release);
        q.pop_front();
      }
    }
    head_[i] = head;
    if (moved) ring_bell(p);
    return moved;
  }

  // Free bytes of the ring to peer `i` with its head at `head`, by the
  // receiver's tail as last read (seen_tail_), less the 16 bytes kept for
  // the next header's cleared word (put).
  std::size_t space_to(std::size_t i, std::uint64_t head) const noexcept {
    return cap_ - 16 - static_cast<std::size_t>(head - seen_tail_[i]);
  }
  // Whether `need` bytes fit in the ring to `p` with its head at `head`. The
  // receiver's tail is read again only when the ring looks too full (a read
  // per send moved that line between the cores twice per message, the
  // receiver's store and this load: 8 B ring all-reduce of 2 ranks 1.33 ->
  // 1.02 us).
  bool room_to(int p, std::uint64_t head, std::size_t need) {
    const auto i = static_cast<std::size_t>(p);
    if (space_to(i, head) >= need) return true;
    seen_tail_[i] = ctl(rank_, p).tail.load(std::memory_order_acquire);
    return space_to(i, head) >= need;
  }

  // A send that can leave whole at once (nothing queued before it to `p`,
  // below the single-copy threshold, one fragment, room in the ring) is
  // written and completed here without entering the queue, whose
  // bookkeeping (a shared_ptr copy and a deque node in and out) lay on the
  // critical path of every small message (benchmarks/results/
  // 2026-11-28-shm-send-fast-path.md). Returns false, touching nothing,
  // otherwise (caller holds mu_).
  bool put_whole(int p, shm_p2p_op& o) {
    const auto i = static_cast<std::size_t>(p);
    if (!out_[i].empty() || !acks_[i].empty() || o.bytes >= cma_bytes_ || o.bytes > cap_ / 4) return false;
    std::uint64_t head = head_[i];
    if (!room_to(p, head, 16 + pad16(o.bytes))) return false;
    put(ring_data(rank_, p), head, o.tag, shm_p2p_data, o.data, o.bytes, o.bytes);
    head_[i] = head;
    o.moved = o.bytes;
    o.started = true;
    o.state.store(shm_p2p_op::done, std::memory_order_release);
    ring_bell(p);
    return true;
  }

  // A request to send (id, addr) from rank `p` matched receive `recv`: its
  // read waits for the end of progress() (caller holds mu_).
  void queue_read(const std::shared_ptr<shm_p2p_op>& recv, int p, std::uint64_t id, std::uint64_t addr) {
    reads_.push_back({recv, p, id, addr});
  }
  // Reads a message whose request to send (id, addr) matched `recv`, straight
  // from rank `p`'s memory, and queues the acknowledgement (caller holds mu_).
  void read_rts(const std::shared_ptr<shm_p2p_op>& recv, int p, std::uint64_t id, std::uint64_t addr) {
    shm_p2p_op& op = *recv;
    const int pid = bell(p).pid.load(std::memory_order_relaxed);
    const int err = shm_cma_read(pid, addr, op.data, op.bytes);
    if (err == 0) {
      op.moved = op.bytes; // done once the acknowledgement is in the ring (pump_out)
    } else {
      fail_op(op, op.describe(rank_) + ": reading the message from process " + std::to_string(pid) +
                      " (process_vm_readv) failed: " + std::strerror(err) +
                      " (DPKIT_SHM_CMA=0 sends every message through the rings)");
    }
    acks_[static_cast<std::size_t>(p)].push_back({id, static_cast<std::uint64_t>(err), err == 0 ? recv : nullptr});
    pump_out(p);
  }

  // Drains the ring from `p` (caller holds mu_).
  bool pump_in(int p) {
    const auto i = static_cast<std::size_t>(p);
    shm_p2p_ring_ctl& c = ctl(p, rank_);
    const std::byte* ring = ring_data(p, rank_);
    std::uint64_t tail = tail_[i];
    const std::uint64_t start = tail;
    incoming& s = in_[i];
    bool moved = false;
    // at most a ring's length per call: a ring that memory written by
    // something else fills with headers that look published cannot keep
    // this rank's wait (and its deadline) inside one call
    while (tail - start < cap_) {
      const std::uint64_t word = header_word(ring, tail).load(std::memory_order_acquire);
      if (!(word & shm_p2p_published)) break; // nothing (more) published
      shm_p2p_header h;
      ring_read(ring, tail, reinterpret_cast<std::byte*>(&h), offsetof(shm_p2p_header, msg));
      h.msg = word & ~shm_p2p_published;
      const std::uint32_t kind = h.frag >> 28;
      const std::size_t len = h.frag & shm_p2p_len_mask;
      const bool data = kind == shm_p2p_data;
      if (len > cap_ - 32 || kind > shm_p2p_ack || (!data && len != 16) || (kind == shm_p2p_rts && s.active) ||
          (data && s.active && (h.tag != s.tag || h.msg != s.msg || s.got + len > s.msg)) ||
          (data && !s.active && len > h.msg)) {
        // a damaged ring (memory written by something else): stop reading it
        const std::string why = "the shared-memory ring from rank " + std::to_string(p) + " to rank " + std::to_string(rank_) +
                   " holds a damaged fragment header (kind " + std::to_string(kind) + ", tag " +
                   std::to_string(h.tag) + ", " + std::to_string(len) + " of " + std::to_string(h.msg) + " bytes)";
        fail_unlocked_all(why);
        return moved;
      }
      if (kind == shm_p2p_ack) {
        std::uint64_t a[2];
        ring_read(ring, tail + 16, reinterpret_cast<std::byte*>(a), sizeof a);
        auto& w = awaiting_[i];
        for (auto it = w.begin(); it != w.end(); ++it) {
          if ((*it)->id != a[0]) continue;
          shm_p2p_op& o = **it;
          if (a[1] == 0) {
            o.moved = o.bytes;
            o.state.store(shm_p2p_op::done, std::memory_order_release);
          } else {
            fail_op(o, o.describe(rank_) + ": rank " + std::to_string(p) +
                           " could not read the message from this process (process_vm_readv: " +
                           std::strerror(static_cast<int>(a[1])) +
                           "; DPKIT_SHM_CMA=0 sends every message through the rings)");
          }
          w.erase(it);
          break;
        }
      } else if (kind == shm_p2p_rts) {
        std::uint64_t a[2];
        ring_read(ring, tail + 16, reinterpret_cast<std::byte*>(a), sizeof a);
        begin_message(s, h, a[0], a[1]);
      } else {
        if (!s.active && !matches_posted(s, h.tag) && !s.early.empty() && s.early_bytes + h.msg > early_budget()) {
          // Flow control: while this peer's unreceived messages hold more than
          // the budget, the next one stays in the ring until its receive is
          // posted, so a sender cannot run arbitrarily far ahead of its
          // receiver (a stream of broadcasts from a root made the receiver
          // buffer thousands of early messages).
          s.held = true;
          s.held_tag = h.tag;
          break;
        }
        s.held = false;
        if (!s.active) begin_message(s, h, 0, 0);
        std::byte* dst = nullptr;
        if (s.target_op) dst = s.target_op->data + s.got;
        else if (s.target_ux) dst = s.target_ux->data.get() + s.got;
        if (len) ring_read(ring, tail + 16, dst, len);
        s.got += len;
        if (s.target_op) s.target_op->moved = s.got;
        if (s.target_ux) s.target_ux->got = s.got;
        if (s.got == s.msg) end_message(s);
      }
      tail += 16 + pad16(len);
      c.tail.store(tail, std::memory_order_release);
      moved = true;
    }
    tail_[i] = tail;
    if (moved) ring_bell(p); // the sender may wait for space
    return moved;
  }
  // Whether a posted receive from this peer takes tag `tag` now.
  static bool matches_posted(const incoming& s, int tag) noexcept {
    for (const auto& o : s.posted)
      if (o->tag == tag) return true;
    return false;
  }
  // Bytes of early messages a peer may have buffered here before the next
  // one waits in the ring for its receive: four rings of the size ranks that
  // share cores use (1 MiB for up to 16 ranks), whatever this area's rings
  // are, so that small rings do not hold senders back sooner.
  std::size_t early_budget() const noexcept { return early_budget_; }

  void end_message(incoming& s) {
    if (s.target_op) s.target_op->state.store(shm_p2p_op::done, std::memory_order_release);
    s.target_op.reset();
    s.target_ux = nullptr;
    s.discard = false;
    s.active = false;
  }
  // A message begins: match it with the oldest posted receive of its tag,
  // else keep it as an early message. A request to send (rts: id, addr) is
  // read at once when matched, else kept (its bytes stay in the sender).
  void begin_message(incoming& s, const shm_p2p_header& h, std::uint64_t id, std::uint64_t addr) {
    const bool rts = (h.frag >> 28) == shm_p2p_rts;
    const int p = static_cast<int>(&s - in_.data());
    s.active = !rts;
    s.tag = h.tag;
    s.msg = h.msg;
    s.got = 0;
    s.target_op.reset();
    s.target_ux = nullptr;
    s.discard = false;
    for (auto it = s.posted.begin(); it != s.posted.end(); ++it) {
      if ((*it)->tag != h.tag) continue;
      std::shared_ptr<shm_p2p_op> op = std::move(*it);
      if (it == s.posted.begin()) s.posted.pop_front(); // the usual case: no generic erase
      else s.posted.erase(it);
      if (op->bytes != h.msg) {
        fail_op(*op, length_text(*op, h.msg));
        if (rts) acks_[static_cast<std::size_t>(p)].push_back({id, 0, nullptr}); // unread: the send completes
        else s.discard = true;
      } else if (rts) {
        queue_read(op, p, id, addr);
      } else {
        s.target_op = std::move(op);
      }
      return;
    }
    auto u = std::make_unique<early_msg>();
    u->tag = h.tag;
    u->bytes = h.msg;
    u->rts = rts;
    u->id = id;
    u->addr = addr;
    if (!rts) {
      u->data = take_buffer(h.msg, u->cap);
      s.target_ux = u.get();
      s.early_bytes += h.msg;
    }
    s.early.push_back(std::move(u));
  }
  // Buffers of early messages are kept for the next ones (at most 16, of at
  // most 4 MiB each; the engine starts with shm_p2p_early_buffers of them):
  // a fresh allocation per early message paid malloc and, at each new size,
  // page faults. The smallest spare buffer that fits (caller holds mu_).
  std::unique_ptr<std::byte[]> take_buffer(std::size_t bytes, std::size_t& cap) {
    const std::size_t need = std::max<std::size_t>(bytes, 1);
    auto best = spare_.end();
    for (auto it = spare_.begin(); it != spare_.end(); ++it)
      if (it->first >= need && (best == spare_.end() || it->first < best->first)) best = it;
    if (best != spare_.end()) {
      cap = best->first;
      auto b = std::move(best->second);
      spare_.erase(best);
      return b;
    }
    cap = need;
    return std::unique_ptr<std::byte[]>(new std::byte[need]);
  }
  void recycle(std::unique_ptr<std::byte[]> b, std::size_t cap) {
    if (!b || cap > (std::size_t{4} << 20)) return;
    if (spare_.size() >= 16) {
      auto smallest = std::min_element(spare_.begin(), spare_.end(),
                                       [](const auto& a, const auto& c) { return a.first < c.first; });
      if (smallest->first >= cap) return;
      spare_.erase(smallest);
    }
    spare_.emplace_back(cap, std::move(b));
  }

  // fail_all with mu_ held.
  void fail_unlocked_all(const std::string& why) {
    for (auto& s : in_) {
      for (auto& o : s.posted) fail_op(*o, why);
      s.posted.clear();
      if (s.target_op) fail_op(*s.target_op, why);
      s.target_op.reset();
      if (s.active) s.discard = s.target_ux == nullptr;
    }
    for (auto& q : out_) {
      for (auto& o : q) fail_op(*o, why);
      q.clear();
    }
    for (auto& q : awaiting_) {
      for (auto& o : q) fail_op(*o, why);
      q.clear();
    }
    for (auto& q : acks_)
      for (auto& a : q)
        if (a.recv) fail_op(*a.recv, why);
    for (auto& d : reads_) fail_op(*d.recv, why);
    reads_.clear();
  }

  int rank_, size_;
  std::size_t cap_;          // ring bytes
  std::size_t early_budget_; // early_budget()
  std::byte* area_;
  std::mutex mu_; // everything below
  std::vector<incoming> in_;
  std::vector<std::deque<std::shared_ptr<shm_p2p_op>>> out_;
  std::vector<std::uint64_t> head_, tail_; // this rank's copies: head of each outgoing ring, tail of each incoming
  std::vector<std::uint64_t> seen_tail_;   // the tail of each outgoing ring at the last look
  std::vector<int> cma_;                   // per peer: 0 not known yet, 1 it may read us, -1 it may not
  std::vector<std::deque<std::shared_ptr<shm_p2p_op>>> awaiting_; // sent requests to send, not acknowledged yet
  // An acknowledgement to write: the request's id, 0 or the errno of the
  // read, and the receive it completes once written (nullptr: none).
  struct pending_ack {
    std::uint64_t id, err;
    std::shared_ptr<shm_p2p_op> recv;
  };
  std::vector<std::deque<pending_ack>> acks_; // per peer, in order
  // A matched request to send whose read waits for progress(): the receive,
  // the sender, the request's id and the buffer's address in the sender.
  struct pending_read {
    std::shared_ptr<shm_p2p_op> recv;
    int peer;
    std::uint64_t id, addr;
  };
  std::deque<pending_read> reads_;
  std::vector<std::uint64_t> next_id_;     // per peer: the id of the next request to send
  std::size_t cma_bytes_;                  // shm_p2p_cma_bytes()
  std::vector<std::pair<std::size_t, std::unique_ptr<std::byte[]>>> spare_; // early buffers to reuse (capacity, buffer)
};

} // namespace dpkit::detail
