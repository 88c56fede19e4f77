// dpkit internals shared by the collective algorithms: argument validation,
// chunk partition, local (host or device) reduce/copy/divide, scratch buffers,
// and waits that name the operation and rank on timeout. Not for users.
#pragma once

#include "../../core/device_ops.hpp"
#include "../../core/errors.hpp"
#include "../../core/options.hpp"
#include "../../core/reduce_op.hpp"
#include "../../core/tensor.hpp"
#include "../../transport/concept.hpp"
#include "../../transport/detail/scratch_arena.hpp"
#include "../../transport/detail/health.hpp"
#include "tags.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpkit::detail {

/// Operation context: names the collective and the rank in messages.
struct op_context {
  const char* name;
  int rank;
  int size;
  std::string prefix() const {
    return std::string(name) + ": rank " + std::to_string(rank) + " of " + std::to_string(size) + ": ";
  }
  [[noreturn]] void invalid(const std::string& msg) const { throw invalid_argument(prefix() + msg); }
};

template <class C>
op_context make_context(const C& comm, const char* name) {
  const int n = comm.size();
  const int r = comm.rank();
  if (n <= 0)
    throw invalid_argument(std::string(name) + ": world size must be >= 1, got " + std::to_string(n) +
                           " (rank " + std::to_string(r) + ")");
  if (r < 0 || r >= n)
    throw invalid_argument(std::string(name) + ": rank " + std::to_string(r) + " out of range for world size " +
                           std::to_string(n));
  return {name, r, n};
}

/// The transport's device primitives (device_transport), or nullptr.
template <class C>
const device_ops* device_of(const C& comm) {
  if constexpr (device_transport<C>) return comm.device();
  else return nullptr;
}

/// The transport's reusable host scratch (scratch_transport), or nullptr.
template <class C>
scratch_arena* arena_of(C& comm) {
  if constexpr (scratch_transport<C>) return &comm.scratch();
  else return nullptr;
}

/// Compile-time rejection of a tensor type whose static memory space the
/// transport (with a constexpr static accepts) cannot move.
template <class C, class T>
constexpr void static_check_space() {
  if constexpr (static_memory_space_v<T>.has_value()) {
    if constexpr (requires { typename std::integral_constant<bool, C::accepts(memory_space::host)>; }) {
      static_assert(C::accepts(*static_memory_space_v<T>),
                    "dpkit: this transport cannot move tensors in this memory space");
    }
  }
}

template <class C>
void check_space(const C& comm, const op_context& ctx, memory_space s, const char* which) {
  if (!comm.accepts(s))
    ctx.invalid(std::string(which) + " tensor is in " + std::string(memory_space_name(s)) +
                " memory, which this transport cannot move");
}

template <class C>
void check_root(const op_context& ctx, int root, const C&) {
  if (root < 0 || root >= ctx.size)
    ctx.invalid("root rank " + std::to_string(root) + " out of range for world size " + std::to_string(ctx.size));
}

/// [begin, end) of chunk c when `count` elements are split over n chunks as
/// evenly as possible (the first count % n chunks get one more).
inline std::pair<std::size_t, std::size_t> chunk_range(std::size_t count, int n, int c) {
  const std::size_t nn = static_cast<std::size_t>(n), cc = static_cast<std::size_t>(c);
  const std::size_t q = count / nn, rem = count % nn;
  const std::size_t b = cc * q + std::min(cc, rem);
  return {b, b + q + (cc < rem ? 1 : 0)};
}

inline int mod(int a, int n) { return ((a % n) + n) % n; }

/// Local operations on one memory space (host loops or the transport's
/// device_ops table).
template <element T>
struct local_ops {
  memory_space space = memory_space::host;
  const device_ops* dev = nullptr;

  void reduce(T* dst, const T* a, const T* b, std::size_t n, reduce_op op) const {
    if (n == 0) return;
    if (space == memory_space::host) reduce_host(dst, a, b, n, op);
    else dev->reduce(dst, a, b, n, element_type_of_v<T>, op, dev->ctx);
  }
  void copy(T* dst, const T* src, std::size_t n) const {
    if (n == 0 || dst == src) return;
    if (space == memory_space::host) std::memcpy(static_cast<void*>(dst), static_cast<const void*>(src), n * sizeof(T));
    else dev->copy(dst, src, n * sizeof(T), dev->ctx);
  }
  void divide(T* p, std::size_t n, std::size_t d) const {
    if (n == 0 || d <= 1) return;
    if (space == memory_space::host) divide_host(p, n, d);
    else dev->divide(p, n, element_type_of_v<T>, d, dev->ctx);
  }
  /// Makes device work visible before a send reads the buffer.
  void sync() const {
    if (space == memory_space::device) dev->synchronize(dev->ctx);
  }
};

template <class C, element T>
local_ops<T> make_local(const C& comm, const op_context& ctx, memory_space s) {
  local_ops<T> l{s, nullptr};
  if (s == memory_space::device) {
    l.dev = device_of(comm);
    if (!l.dev) ctx.invalid("tensor is in device memory but the transport has no device primitives");
  }
  return l;
}

/// Uninitialized scratch of n elements in a memory space (never zero-filled).
/// Host scratch comes from slot `slot` of the transport's arena lease when one
/// is given (reused across calls), else from the heap.
template <element T>
class scratch {
public:
  scratch() = default;
  scratch(std::size_t n, const local_ops<T>& l, scratch_arena::lease* lease = nullptr, int slot = 0)
      : dev_(l.dev), n_(n) {
    if (n == 0) return;
    if (l.space == memory_space::host) {
      if (lease) ptr_host_ = reinterpret_cast<T*>(lease->buffer(slot, n * sizeof(T)));
      else host_ = std::make_unique_for_overwrite<T[]>(n);
    } else {
      ptr_ = static_cast<T*>(dev_->allocate(n * sizeof(T), dev_->ctx));
    }
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  ~scratch() {
    if (ptr_) dev_->deallocate(ptr_, dev_->ctx);
  }
  T* data() noexcept { return ptr_host_ ? ptr_host_ : host_ ? host_.get() : ptr_; }
  std::size_t size() const noexcept { return n_; }

private:
  std::unique_ptr<T[]> host_;
  T* ptr_host_ = nullptr;
  const device_ops* dev_ = nullptr;
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
};

template <class T>
std::span<const std::byte> bytes_of(const T* p, std::size_t n) {
  return {reinterpret_cast<const std::byte*>(p), n * sizeof(T)};
}
template <class T>
std::span<std::byte> bytes_of(T* p, std::size_t n) {
  return {reinterpret_cast<std::byte*>(p), n * sizeof(T)};
}

/// One running collective: its fingerprint and sequence number (checked
/// transports), its message tags, its deadline, and waits that name the
/// operation, sequence number, peer and bytes done when they fail. A failure
/// inside the scope (any error but invalid_argument, or an exception leaving
/// the body) fails the transport and tells its peers (checked transports), so
/// later calls throw communicator_error instead of computing on a transport in
/// an unknown state.
template <class C>
class collective_scope {
public:
  collective_scope(C& comm, const op_context& ctx, coll_kind kind, const char* algo, element_type type,
                   std::size_t count, std::optional<reduce_op> op, int root, const collective_options& o)
      : comm_(comm), ctx_(ctx), dl_(deadline_after(o.timeout)), timeout_(o.timeout), tag_base_(o.tag),
        uncaught_(std::uncaught_exceptions()) {
    fp_.kind = static_cast<std::uint8_t>(kind);
    fp_.type = static_cast<std::uint8_t>(type);
    fp_.count = count;
    fp_.op = op ? static_cast<std::uint8_t>(*op) : std::uint8_t{0xff};
    fp_.root = root;
    fp_.stream = o.tag;
    std::memcpy(fp_.algo, algo, std::min(sizeof fp_.algo, std::strlen(algo)));
    if constexpr (requires { comm.check_usable(ctx.name); }) comm.check_usable(ctx.name);
    if constexpr (checked_transport<C>) {
      auto& h = comm.health();
      h.check(ctx.name, ctx.rank);
      h.begin(fp_);
      if (h.tags_enabled && o.check >= 1) tag_base_ = checked_tag_base(fp_.seq, fp_.hash());
      // The fingerprint reaches the shared segment (where a peer waiting in a
      // shm collective, which sends no tagged messages, reads it) only when
      // this rank has to wait: shm_steps and the transports' waits publish
      // it then, so a call that never waits pays nothing for it.
    }
  }
  collective_scope(const collective_scope&) = delete;
  collective_scope& operator=(const collective_scope&) = delete;
  ~collective_scope() {
    if (std::uncaught_exceptions() <= uncaught_) return;
    if (!reported_) report("an exception left the collective");
    // The failed call's requests are gone by now (declared after the
    // scope); a transport whose MPI may still hold their buffers waits for
    // its peers to let go of them before the caller gets the buffers back.
    if constexpr (requires { comm_.settle(timeout_); }) comm_.settle(timeout_);
  }

  /// The tag of algorithm part t.
  int tag(tag_offset t) const noexcept { return tag_base_ + static_cast<int>(t); }
  /// The tag base: on checked transports at check >= 1 it carries the
  /// sequence number and fingerprint hash (foreign_tag compares those).
  int tag_base() const noexcept { return tag_base_; }
  /// The collective's deadline.
  deadline due() const noexcept { return dl_; }
  /// This call's fingerprint (seq is meaningful on checked transports).
  const fingerprint& fp() const noexcept { return fp_; }

  /// Waits r against the deadline; on failure throws the same error type with
  /// the operation context and fails the transport.
  template <class R>
  void wait(R& r) {
    guard([&] { r.wait(dl_); });
    if constexpr (requires { r.bytes(); }) bytes_done_ += r.bytes();
  }
  /// Runs f (a native collective) under the same error translation as wait.
  template <class F>
  void guard(F&& f) {
    try {
      f();
    } catch (const invalid_argument&) {
      throw;
    } catch (const timeout_error& e) {
      fail_with<timeout_error>(describe() + " did not finish within its deadline of " + std::to_string(timeout_.count()) +
                               " ms, " + std::to_string(bytes_done_) + " bytes done by this rank (" + e.what() + ")");
    } catch (const mismatch_error& e) {
      fail_with<mismatch_error>(describe() + ": " + e.what());
    } catch (const peer_error& e) {
      fail_with<peer_error>(describe() + ": " + e.what());
    } catch (const communicator_error& e) {
      fail_with<communicator_error>(describe() + ": " + e.what());
    } catch (const error& e) {
      fail_with<error>(describe() + ": " + e.what());
    }
  }
  /// The agreement step (collective_options::check == 2) when asked and the
  /// transport offers one: every rank all-gathers its fingerprint and a
  /// difference throws mismatch_error on every rank.
  void agree_if(int level) {
    if constexpr (checked_transport<C> && requires { comm_.agree(fp_, dl_); }) {
      if (level >= 2) guard([&] { comm_.agree(fp_, dl_); });
    }
  }
  /// Waits every request of rs (then clears rs).
  template <class R>
  void wait_all(std::vector<R>& rs) {
    for (auto& r : rs) wait(r);
    rs.clear();
  }

private:
  std::string describe() const { return ctx_.prefix() + fp_.str(); }
  template <class E>
  [[noreturn]] void fail_with(const std::string& msg) {
    report(msg);
    throw E(msg);
  }
  void report(const std::string& msg) {
    reported_ = true;
    if constexpr (checked_transport<C>) {
      comm_.report_failure(msg);
      comm_.health().observed(); // this call throws it: later calls are reuse
    }
  }

  C& comm_;
  const op_context& ctx_;
  deadline dl_;
  std::chrono::milliseconds timeout_;
  int tag_base_;
  int uncaught_;
  fingerprint fp_{};
  std::size_t bytes_done_ = 0;
  bool reported_ = false;
};

/// What a collective of zero elements still does on a checked transport
/// (checks on, more than one rank): it takes part in the mismatch check like
/// any other call instead of returning at once. Returning at once would leave
/// this rank a call behind a peer that passed a non-zero count: its next call
/// would pair with the peer's call before, and both would compute on the
/// wrong partners' data without an error. Here every rank sends an empty
/// message to the next rank of the ring and receives one from the previous
/// rank, under the call's checked tag: a peer at this sequence number that
/// runs another call sees a message of another collective (mismatch_error),
/// and every rank waits for its neighbour to reach this call (one message
/// latency per zero-element call).
/// @throws what collective_scope::wait throws.
template <class C>
void zero_count_check(C& comm, collective_scope<C>& S, const op_context& ctx) {
  if constexpr (checked_transport<C>) {
    if (ctx.size == 1 || !is_checked_tag(S.tag_base())) return;
    const int tag = S.tag(tag_offset::zero_count);
    auto recv = comm.irecv(std::span<std::byte>{}, mod(ctx.rank - 1, ctx.size), tag);
    auto send = comm.isend(std::span<const std::byte>{}, mod(ctx.rank + 1, ctx.size), tag);
    S.wait(recv);
    S.wait(send);
  } else {
    (void)comm, (void)S, (void)ctx;
  }
}

/// Segment size in elements for options o (>= 1).
template <class T>
std::size_t segment_elems(const collective_options& o) {
  return std::max<std::size_t>(1, o.segment_bytes / sizeof(T));
}

inline std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

/// Validates tensor t for a collective: contiguous (no strided view), a
/// non-null pointer when it has elements, a byte size that fits std::size_t.
/// @throws dpkit::invalid_argument naming the operation, rank and tensor.
template <tensor Tn>
void check_tensor(const op_context& ctx, const Tn& t, const char* which) {
  using T = tensor_value_t<Tn>;
  if (!runtime_contiguous(t)) ctx.invalid(std::string(which) + " tensor is a strided (non-contiguous) view");
  const std::size_t n = size_of(t);
  if (n > std::numeric_limits<std::size_t>::max() / sizeof(T))
    ctx.invalid(std::string(which) + " tensor has " + std::to_string(n) + " elements of " + std::to_string(sizeof(T)) +
                " bytes: the byte size overflows");
  if (n > 0 && traits_of<Tn>::data(const_cast<bare_t<Tn>&>(t)) == nullptr)
    ctx.invalid(std::string(which) + " tensor has " + std::to_string(n) + " elements but a null data pointer");
}

/// Resolves (in, out) tensors into typed pointers after validating spaces and
/// lengths. `expected_out` is the required out size given the input size.
template <class C, tensor In, tensor Out>
auto resolve_inout(const C& comm, const op_context& ctx, const In& in, Out& out, std::size_t expected_out,
                   const char* in_name = "input", const char* out_name = "output") {
  using T = tensor_value_t<In>;
  static_assert(std::is_same_v<T, tensor_value_t<Out>>, "dpkit: input and output tensors must have the same element type");
  static_check_space<C, In>();
  static_check_space<C, Out>();
  check_tensor(ctx, in, in_name);
  check_tensor(ctx, out, out_name);
  const memory_space si = space_of(in), so = space_of(out);
  check_space(comm, ctx, si, in_name);
  check_space(comm, ctx, so, out_name);
  if (si != so)
    ctx.invalid(std::string(in_name) + " is in " + std::string(memory_space_name(si)) + " memory but " + out_name +
                " is in " + std::string(memory_space_name(so)) + " memory");
  auto os = as_span(out);
  if (os.size() != expected_out)
    ctx.invalid(std::string(out_name) + " has " + std::to_string(os.size()) + " elements, expected " +
                std::to_string(expected_out) + " (" + in_name + " has " + std::to_string(size_of(in)) + ")");
  return std::pair<const T*, T*>{as_span(in).data(), os.data()};
}

/// The data pointers (P: T* or const T*) of a list form's blocks on root:
/// world size tensors of `count` elements each, contiguous, in memory space
/// `space` (the other side's). `which` names the side ("output", "input").
/// @throws invalid_argument naming the list's length or the block, its size
///         or space, and the rank.
template <class P, class C, class L>
std::vector<P> list_blocks(const C& comm, const op_context& ctx, L& list, std::size_t count, memory_space space,
                           const char* which) {
  const auto n = static_cast<std::size_t>(ctx.size);
  if (static_cast<std::size_t>(std::ranges::size(list)) != n)
    ctx.invalid(std::string(which) + " list has " + std::to_string(std::ranges::size(list)) +
                " tensors, expected one per rank (" + std::to_string(n) + ")");
  std::vector<P> ps;
  ps.reserve(n);
  for (auto&& b : list) {
    const std::string name = std::string(which) + " block " + std::to_string(ps.size());
    static_check_space<C, std::remove_cvref_t<decltype(b)>>();
    check_tensor(ctx, b, name.c_str());
    check_space(comm, ctx, space_of(b), name.c_str());
    if (space_of(b) != space)
      ctx.invalid(name + " is in " + std::string(memory_space_name(space_of(b))) + " memory, the other side in " +
                  std::string(memory_space_name(space)) + " memory");
    if (size_of(b) != count)
      ctx.invalid(name + " has " + std::to_string(size_of(b)) + " elements, expected " + std::to_string(count));
    ps.push_back(as_span(b).data());
  }
  return ps;
}

/// For NCCL-style in-place reduce-scatter / all-gather: validates tensor t
/// (count x n elements, a movable memory space) and returns (data, count).
template <class C, tensor Tn>
auto resolve_chunked_inplace(const C& comm, const op_context& ctx, Tn& t) {
  check_tensor(ctx, t, "tensor");
  const std::size_t total = size_of(t), n = static_cast<std::size_t>(ctx.size);
  if (total % n != 0)
    ctx.invalid("tensor has " + std::to_string(total) + " elements, not a multiple of the world size " +
                std::to_string(n));
  static_check_space<C, Tn>();
  check_space(comm, ctx, space_of(t), "tensor");
  return std::pair{as_span(t).data(), total / n};
}

/// For broadcast: on root, (in, out) must be an out-of-place-or-aliased pair of
/// equal size; elsewhere only out is used (in may be empty). Returns (in data
/// or nullptr off root, out data).
template <class C, tensor In, tensor Out>
auto resolve_broadcast(const C& comm, const op_context& ctx, const In& in, Out& out, int root) {
  using T = tensor_value_t<Out>;
  static_assert(std::is_same_v<tensor_value_t<In>, T>, "dpkit: input and output element types differ");
  check_root(ctx, root, comm);
  if (ctx.rank == root) return resolve_inout(comm, ctx, in, out, size_of(in));
  static_check_space<C, Out>();
  check_tensor(ctx, out, "output");
  check_space(comm, ctx, space_of(out), "output");
  return std::pair<const T*, T*>{nullptr, as_span(out).data()};
}

/// For reduce: on root, (in, out) are validated as a pair of equal size;
/// elsewhere only in is used (out may be empty). Returns (in data, out data or
/// nullptr off root).
template <class C, tensor In, tensor Out>
auto resolve_reduce(const C& comm, const op_context& ctx, const In& in, Out& out, int root) {
  using T = tensor_value_t<In>;
  check_root(ctx, root, comm);
  if (ctx.rank == root) return resolve_inout(comm, ctx, in, out, size_of(in));
  static_check_space<C, In>();
  check_tensor(ctx, in, "input");
  check_space(comm, ctx, space_of(in), "input");
  return std::pair<const T*, T*>{as_span(in).data(), nullptr};
}

/// Runs f(comm), the transport's native collective (algorithm::native), as a
/// checked collective: numbered, under the deadline (transports that take a
/// native_call: mpi), preceded by the fingerprint agreement step when
/// o.check; otherwise throws dpkit::invalid_argument naming the
/// operation and rank.
template <class C, class F>
void call_native(C& comm, const op_context& ctx, coll_kind kind, element_type t, std::size_t count,
                 std::optional<reduce_op> op, int root, const collective_options& o, F&& f) {
  if constexpr (native_collectives<C>) {
    collective_scope<C> S(comm, ctx, kind, "native", t, count, op, root, o);
    S.guard([&] {
      if constexpr (requires { comm.begin_native(native_call{}); }) {
        struct reset_call {
          C& c;
          ~reset_call() { c.begin_native(native_call{}); } // direct native_* calls stay blocking
        } reset{comm};
        S.agree_if(o.check);
        comm.begin_native(native_call{S.due(), S.fp(), o.native_deadline, o.check});
        f(comm);
      } else {
        f(comm);
      }
    });
  } else {
    ctx.invalid("algorithm::native requested but this transport has no native collectives");
  }
}

/// Throws dpkit::invalid_argument: algorithm `a` does not exist for this
/// collective (e.g. a tree reduce-scatter).
[[noreturn]] inline void no_such_algorithm(const op_context& ctx, std::string_view a) {
  ctx.invalid("no " + std::string(a) + " algorithm for this collective (use automatic, native or the one it has)");
}

} // namespace dpkit::detail
