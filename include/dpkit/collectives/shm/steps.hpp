/// @file steps.hpp
/// @brief Internal: numbered steps over a transport's shared segment
/// (transport/detail/shm_segment.hpp), the synchronization every
/// shared-memory algorithm of this folder uses, and the helpers they share
/// (the segment of a transport, claiming it, chunk sizes, what automatic
/// picks on one node). Not for users; the algorithms are allreduce.hpp,
/// broadcast.hpp, reduce.hpp, allgather.hpp and reduce_scatter.hpp beside it.
//
// Protocol. Every rank keeps a step counter e in its control line. A step:
// (1) the rank writes its own buffer (e + 1) % 2, (2) publishes e + 1 with a
// release store, (3) waits (acquire) until every peer published >= e + 1,
// (4) reads peers' buffers of that step (a waiter that sleeps does so on a
// futex over the peer's counter, which the peer wakes after its store).
// Every step waits for every peer, so when a rank starts step e + 1 every peer has published e, i.e. finished
// reading step e - 1, the last user of buffer (e + 1) % 2: two buffers make
// back-to-back steps and back-to-back collectives safe without any extra
// barrier (DeepSpeed's rotating state values). The published word carries the
// low 20 bits of the collective's fingerprint hash mixed with its sequence number; a peer at the same step
// with another hash runs another collective (mismatch_error). Every wait
// watches the deadline, the segment's abort words and (about every
// millisecond) the transport's fault notices.
#pragma once

#include "../detail/common.hpp"
#include "../policy.hpp"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

namespace dpkit::detail {

/// The steps of one shm collective on rank ctx.rank (see the protocol above).
template <class C>
class shm_steps {
public:
  shm_steps(C& comm, shm_segment& seg, collective_scope<C>& S, const op_context& ctx)
      : comm_(comm), seg_(seg), S_(S), ctx_(ctx),
        e_(seg.control(ctx.rank).step.load(std::memory_order_relaxed) >> shm_hash_bits),
        hash_(step_hash(S.fp())), spins_(shm_spin_count(ctx.size)),
        yields_(shm_yield_polls()) {}

  /// The buffer this rank writes for the next step (then publish()).
  int next_buffer() const noexcept { return static_cast<int>((e_ + 1) & 1u); }
  /// This rank's buffer b.
  std::byte* mine(int b) const noexcept { return seg_.buffer(ctx_.rank, b); }
  /// Rank p's buffer b.
  const std::byte* of(int p, int b) const noexcept { return seg_.buffer(p, b); }
  /// Publishes the next step (this rank's writes to next_buffer() are done)
  /// and waits until every peer published it too.
  void step() {
    ++e_;
    shm_publish_step(seg_.control(ctx_.rank), (e_ << shm_hash_bits) | hash_);
    for (int p = 0; p < ctx_.size; ++p)
      if (p != ctx_.rank) wait_for(p);
  }

private:
  // The 20 bits a step word carries: the fingerprint hash mixed with the
  // sequence number, so a peer a call ahead or behind (same call, another
  // sequence number) is a mismatch too, not a partner.
  static std::uint64_t step_hash(const fingerprint& fp) noexcept {
    return (fp.hash() ^ static_cast<std::uint32_t>(fp.seq * 0x9E3779B1u)) & shm_hash_mask;
  }
  void wait_for(int p) {
    auto& word = seg_.control(p).step;
    auto ready = [&] { return (word.load(std::memory_order_acquire) >> shm_hash_bits) >= e_; };
    if (!ready()) {
      publish_once(); // a peer that waits for us can name what we run
      S_.guard([&] {
        auto next_poll = clock::now() + std::chrono::milliseconds(1);
        shm_wait(ready, [&] {
          if (seg_.aborted()) {
            poll_unless_ready(p, ready);
            if (ready()) return;
            throw peer_error("shm: rank " + std::to_string(ctx_.rank) + " stops: a peer's collective failed");
          }
          const auto now = clock::now();
          if (now >= next_poll) {
            poll_unless_ready(p, ready);
            check_peer_call(p, ready);
            next_poll = now + std::chrono::milliseconds(1);
          }
          if (now > S_.due() && !ready())
            throw timeout_error("shm: rank " + std::to_string(ctx_.rank) + " timed out waiting for rank " +
                                std::to_string(p) + " at shared-memory step " + std::to_string(e_) + " (rank " +
                                std::to_string(p) + " is at step " +
                                std::to_string(word.load(std::memory_order_acquire) >> shm_hash_bits) + ")");
        }, spins_, &seg_.control(p), yields_);
      });
    }
    const std::uint64_t w = word.load(std::memory_order_acquire);
    if ((w >> shm_hash_bits) == e_ && (w & shm_hash_mask) != hash_) {
      // The peer sees the same mismatch at this step and publishes its call
      // then (or did while waiting): give it up to 100 ms (within the
      // deadline) so the error names both sides.
      publish_once();
      const fingerprint& mine = S_.fp();
      const auto until = std::min(S_.due(), clock::now() + std::chrono::milliseconds(100));
      fingerprint theirs = seg_.published(p);
      while (!(theirs.valid && theirs.seq == mine.seq && theirs.stream == mine.stream) && clock::now() < until) {
        std::this_thread::yield();
        theirs = seg_.published(p);
      }
      const std::string what =
          theirs.valid && theirs.seq == mine.seq && !theirs.same_call(mine)
              ? mismatch_text(ctx_.rank, mine, p, theirs)
              : "collective mismatch: rank " + std::to_string(ctx_.rank) + " runs " + mine.str() + "; rank " +
                    std::to_string(p) + " runs another collective at the same shared-memory step " + std::to_string(e_);
      S_.guard([&] { throw mismatch_error(what); });
    }
  }
  // A peer that published (collective_scope) another call at this call's
  // sequence number and stream runs something else: mismatch_error naming
  // both (it may be in a ring or tree collective that sends us nothing).
  template <class Ready>
  void check_peer_call(int p, Ready& ready) {
    const fingerprint& mine = S_.fp();
    if (!mine.valid) return;
    const fingerprint theirs = seg_.published(p);
    if (!theirs.valid || theirs.seq != mine.seq || theirs.stream != mine.stream || theirs.same_call(mine)) return;
    if (ready()) return;
    throw mismatch_error(mismatch_text(ctx_.rank, mine, p, theirs));
  }
  // The transport's own failure checks (fault notices, a peer that returned),
  // unless the peer's step arrived meanwhile.
  template <class Ready>
  void poll_unless_ready(int p, Ready& ready) {
    try {
      comm_.shm_poll(p, S_.tag_base());
    } catch (...) {
      if (!ready()) throw;
    }
  }

  void publish_once() noexcept {
    if (published_) return;
    seg_.publish(S_.fp());
    published_ = true;
  }

  C& comm_;
  shm_segment& seg_;
  collective_scope<C>& S_;
  const op_context& ctx_;
  std::uint64_t e_;
  std::uint64_t hash_;
  int spins_;
  unsigned yields_;
  bool published_ = false;
};

/// A shared-memory collective of zero elements (more than one rank): one
/// step, whose word carries the call's fingerprint hash and sequence number,
/// so it takes part in the mismatch check like any other call instead of
/// returning at once and leaving this rank a call behind a peer that passed a
/// non-zero count (zero_count_check in common.hpp says why).
/// @throws what shm_steps::step throws (mismatch_error, peer_error,
///         timeout_error).
template <class C>
void shm_zero_count_check(C& comm, shm_segment& seg, collective_scope<C>& S, const op_context& ctx) {
  if (ctx.size == 1) return;
  shm_steps<C> st(comm, seg, S, ctx);
  st.step();
}

/// Elements of T that one buffer of `seg` holds per rank share (`shares`
/// shares per buffer); invalid_argument when not even one.
template <element T>
std::size_t shm_chunk_elems(const shm_segment& seg, const op_context& ctx, std::size_t shares = 1) {
  const std::size_t cap = seg.slot_bytes() / sizeof(T) / shares;
  if (cap == 0)
    ctx.invalid("the shared segment's buffers (" + std::to_string(seg.slot_bytes()) + " bytes) hold fewer than " +
                std::to_string(shares) + " element(s) per " + (shares == 1 ? "buffer" : "rank"));
  return cap;
}

/// The one-rank result: out = in (op over one rank; avg divides by 1).
template <element T>
void shm_single_rank(const T* in, T* out, std::size_t count) {
  if (out != in) std::memcpy(static_cast<void*>(out), static_cast<const void*>(in), count * sizeof(T));
}

/// Claims the transport's segment for one collective (one shm collective at a
/// time per transport); releases it on destruction.
class shm_claim {
public:
  shm_claim(shm_segment& seg, const op_context& ctx) : seg_(seg) {
    if (seg.busy().exchange(true, std::memory_order_acquire))
      ctx.invalid("another shared-memory collective runs on this transport now (one at a time per transport)");
  }
  shm_claim(const shm_claim&) = delete;
  shm_claim& operator=(const shm_claim&) = delete;
  ~shm_claim() { seg_.busy().store(false, std::memory_order_release); }

private:
  shm_segment& seg_;
};

/// The transport's segment, or invalid_argument naming the operation when it
/// has none (not a shared_memory_transport, ranks on several nodes,
/// DPKIT_SHM_BYTES=0).
template <class C>
shm_segment& shm_of(C& comm, const op_context& ctx) {
  if constexpr (shared_memory_transport<C>) {
    if (shm_segment* s = comm.shm()) {
      if (s->size() != ctx.size || s->rank() != ctx.rank)
        ctx.invalid("the shared segment's ranks do not match the transport's");
      return *s;
    }
    ctx.invalid("shared memory is unavailable on this transport (ranks on several nodes, or DPKIT_SHM_BYTES=0)");
  } else {
    ctx.invalid("algorithm::shm requested but this transport cannot map a shared segment");
  }
}

/// True when transport comm offers a shared segment now.
template <class C>
bool shm_available(C& comm) noexcept {
  if constexpr (shared_memory_transport<C>) return comm.shm() != nullptr;
  else return false;
}

/// What algorithm::automatic runs for broadcast, reduce, all-gather and
/// reduce-scatter (`kind`) of `bytes` bytes per rank (broadcast, reduce: the
/// message; all-gather: one rank's part; reduce-scatter: one rank's result):
/// shm when the transport has a shared segment and every buffer is host
/// memory, except where tree (broadcast, reduce) or ring (all-gather) measured
/// faster, else `otherwise` (tree for the rooted ones, ring for the others).
/// From the np 2, 3, 4 runs in docs/tuning.md ("Shared-memory broadcast,
/// reduce, all-gather, reduce-scatter", two runs each, 8 B to 8 MiB):
/// - all-gather on 2 ranks from 16 KiB per rank: ring (shm copies each part
///   twice, through the peer's freshly written cache lines: 0.2-0.8x native
///   against the ring's 0.8-1.0x);
/// - with more ranks than cores (every shm step waits for a rank that is not
///   running; the tree's root and leaves wait less): broadcast below 512 B,
///   reduce below 512 B and from 32 KiB to 1 MiB: tree.
/// The choice is the same on every rank (same arguments; the segment exists
/// on all ranks or none; one node, so one core count).
template <class C, class... Tensors>
algorithm automatic_with_shm(C& comm, coll_kind kind, std::size_t bytes, algorithm otherwise,
                             const Tensors&... buffers) noexcept {
  if (!shm_available(comm) || !((space_of(buffers) == memory_space::host) && ...)) return otherwise;
  const int n = comm.size();
  const bool oversubscribed = shm_oversubscribed(n);
  switch (kind) {
  case coll_kind::allgather:
    if (n == 2 && bytes >= (std::size_t{16} << 10)) return otherwise;
    break;
  case coll_kind::broadcast:
    if (oversubscribed && bytes < 512) return otherwise;
    break;
  case coll_kind::reduce:
    if (oversubscribed && (bytes < 512 || (bytes >= (std::size_t{32} << 10) && bytes < (std::size_t{1} << 20))))
      return otherwise;
    break;
  default: break;
  }
  return algorithm::shm;
}

/// The shared segment of `comm` for a shm collective on host tensors, or
/// invalid_argument naming the operation.
template <class C>
shm_segment& shm_for(C& comm, const op_context& ctx, memory_space space) {
  if (space != memory_space::host) ctx.invalid("shared-memory collectives need host tensors");
  return shm_of(comm, ctx);
}

/// dst = src[0] op src[1] op ... op src[n-1] over `len` elements (rank order,
/// so every rank computing it gets the same bits); avg divides by n after.
template <element T, class Src>
void shm_reduce_ranks(T* dst, Src&& src, int n, std::size_t len, reduce_op op) {
  if (len == 0) return;
  if (n == 1) std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src(0)), len * sizeof(T));
  else {
    reduce_host(dst, src(0), src(1), len, op);
    for (int p = 2; p < n; ++p) reduce_host(dst, static_cast<const T*>(dst), src(p), len, op);
  }
  if (op == reduce_op::avg) divide_host(dst, len, static_cast<std::size_t>(n));
}

} // namespace dpkit::detail
