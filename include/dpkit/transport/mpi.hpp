/// @file mpi.hpp
/// @brief The MPI transport: wraps an MPI communicator (never calls MPI_Init
/// or MPI_Finalize itself), host memory.
///
/// @code
/// int provided;
/// MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
/// {
///   dpkit::mpi comm(MPI_COMM_WORLD);      // duplicates the communicator
///   dpkit::allreduce(comm, grads, dpkit::reduce_op::avg);
/// }                                       // frees the duplicate
/// MPI_Finalize();
/// @endcode
///
/// Point-to-point requests are MPI_Isend/MPI_Irecv of MPI_BYTE on the
/// duplicated communicator (messages over 1 GiB are split into several
/// requests, since MPI counts are int). wait(deadline) polls MPI_Testall, so a
/// peer that never arrives yields dpkit::timeout_error rather than a hang; the
/// timed-out requests are cancelled.
///
/// Threading: blocking collectives may be called from any one thread at a
/// time. The *_async collectives run on the transport's communication thread,
/// which calls MPI concurrently with the caller only if the caller also calls
/// MPI meanwhile: initialize MPI with MPI_THREAD_MULTIPLE for that (or
/// MPI_THREAD_SERIALIZED if the caller does not touch MPI while a handle is
/// pending).
#pragma once

#include "../core/async.hpp"
#include "../core/element.hpp"
#include "../core/errors.hpp"
#include "../core/options.hpp"
#include "../core/reduce_op.hpp"
#include "../core/tensor.hpp"
#include "detail/scratch_arena.hpp"
#include "concept.hpp"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <climits>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace dpkit {

namespace detail {
inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<std::size_t>(len));
}
inline void mpi_check(int code, const char* call, int rank) {
  if (code != MPI_SUCCESS)
    throw error(std::string(call) + " failed on rank " + std::to_string(rank) + ": " + mpi_error_string(code));
}
/// Largest message one MPI request carries (bytes).
inline constexpr std::size_t mpi_max_message = std::size_t{1} << 30;
} // namespace detail

/// A pending MPI send or receive (models dpkit::request). Holds one MPI
/// request per 1 GiB piece (inline for the usual single piece, so a message
/// costs no heap allocation). Destroying it while incomplete cancels it.
class mpi_request {
public:
  mpi_request() = default;
  /// Internal: takes ownership of `count` requests (first inline, rest in more).
  mpi_request(MPI_Request first, std::vector<MPI_Request> more, int rank, int peer, int tag, bool is_send)
      : first_(first), more_(std::move(more)), rank_(rank), peer_(peer), tag_(tag), is_send_(is_send) {}
  mpi_request(mpi_request&& o) noexcept { swap(o); }
  mpi_request& operator=(mpi_request&& o) noexcept {
    if (this != &o) {
      cancel();
      swap(o);
    }
    return *this;
  }
  ~mpi_request() { cancel(); }

  /// True once complete (progresses MPI).
  /// @throws dpkit::error if MPI reports an error.
  bool test() {
    if (first_ != MPI_REQUEST_NULL) {
      int flag = 0;
      detail::mpi_check(MPI_Test(&first_, &flag, MPI_STATUS_IGNORE), "MPI_Test", rank_);
      if (!flag) return false;
    }
    if (!more_.empty()) {
      int flag = 0;
      detail::mpi_check(MPI_Testall(static_cast<int>(more_.size()), more_.data(), &flag, MPI_STATUSES_IGNORE),
                        "MPI_Testall", rank_);
      if (!flag) return false;
      more_.clear();
    }
    return true;
  }
  /// Polls until complete.
  /// @throws dpkit::timeout_error past deadline d (naming rank, peer, tag);
  ///         dpkit::error if MPI reports an error.
  void wait(deadline d) {
    unsigned spins = 0;
    while (!test()) {
      if ((++spins & 63u) == 0) {
        if (clock::now() > d) {
          cancel();
          throw timeout_error("mpi: rank " + std::to_string(rank_) + " timed out waiting for " +
                              (is_send_ ? "send to" : "receive from") + " rank " + std::to_string(peer_) + " (tag " +
                              std::to_string(tag_) + ")");
        }
        if (spins > 1024) std::this_thread::yield(); // let an oversubscribed peer run
      }
    }
  }

private:
  void swap(mpi_request& o) noexcept {
    std::swap(first_, o.first_);
    std::swap(more_, o.more_);
    std::swap(rank_, o.rank_);
    std::swap(peer_, o.peer_);
    std::swap(tag_, o.tag_);
    std::swap(is_send_, o.is_send_);
  }
  static void cancel_one(MPI_Request& r) noexcept {
    if (r == MPI_REQUEST_NULL) return;
    int done = 0;
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (!done) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    r = MPI_REQUEST_NULL;
  }
  void cancel() noexcept {
    if (first_ == MPI_REQUEST_NULL && more_.empty()) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    cancel_one(first_);
    for (auto& r : more_) cancel_one(r);
    more_.clear();
  }

  MPI_Request first_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> more_;
  int rank_ = 0, peer_ = 0, tag_ = 0;
  bool is_send_ = false;
};

/// MPI transport over a communicator (models dpkit::transport,
/// dpkit::native_collectives, dpkit::async_transport). Host memory only
/// (a CUDA-aware MPI could accept device memory; not assumed). Move-only.
class mpi {
public:
  /// Wraps `comm`. With `duplicate` (default), dpkit works on an
  /// MPI_Comm_dup of it (collective over comm), so its messages never match
  /// the application's; the duplicate is freed by the destructor, which must
  /// run before MPI_Finalize.
  /// @throws dpkit::error if MPI is not initialized or a call fails.
  explicit mpi(MPI_Comm comm = MPI_COMM_WORLD, bool duplicate = true) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) throw error("dpkit::mpi: MPI is not initialized (call MPI_Init_thread first)");
    if (duplicate) {
      detail::mpi_check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup", -1);
      owned_ = true;
    } else {
      comm_ = comm;
    }
    detail::mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", -1);
    detail::mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", rank_);
    create_half_ops();
  }
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  mpi(mpi&& o) noexcept
      : comm_(o.comm_), owned_(o.owned_), rank_(o.rank_), size_(o.size_), half_ops_(o.half_ops_),
        arena_(std::move(o.arena_)), progress_(std::move(o.progress_)) {
    o.owned_ = false;
    o.half_ops_.fill(MPI_OP_NULL);
  }
  ~mpi() {
    progress_.reset(); // finish queued async collectives first
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& op : half_ops_)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    if (owned_) MPI_Comm_free(&comm_);
  }

  /// This rank in the communicator.
  int rank() const noexcept { return rank_; }
  /// Number of ranks.
  int size() const noexcept { return size_; }
  /// Host memory only.
  static constexpr bool accepts(memory_space s) noexcept { return s == memory_space::host; }
  /// The (duplicated) communicator dpkit uses.
  MPI_Comm native_handle() const noexcept { return comm_; }

  /// MPI_Isend of `data` (bytes) to `peer` with `tag`.
  /// @throws dpkit::invalid_argument if peer is out of range; dpkit::error on MPI failure.
  mpi_request isend(std::span<const std::byte> data, int peer, int tag) {
    check_peer(peer, "isend");
    return start(data.size(), peer, tag, true, [&](std::size_t off, int n, MPI_Request* r) {
      detail::mpi_check(MPI_Isend(data.data() + off, n, MPI_BYTE, peer, tag, comm_, r), "MPI_Isend", rank_);
    });
  }
  /// MPI_Irecv of exactly data.size() bytes from `peer` with `tag`.
  /// @throws dpkit::invalid_argument if peer is out of range; dpkit::error on MPI failure.
  mpi_request irecv(std::span<std::byte> data, int peer, int tag) {
    check_peer(peer, "irecv");
    return start(data.size(), peer, tag, false, [&](std::size_t off, int n, MPI_Request* r) {
      detail::mpi_check(MPI_Irecv(data.data() + off, n, MPI_BYTE, peer, tag, comm_, r), "MPI_Irecv", rank_);
    });
  }

  /// The communication thread running *_async collectives in order.
  progress_thread& progress() { return *progress_; }
  /// Host scratch reused by this transport's collectives (internal).
  detail::scratch_arena& scratch() { return *arena_; }

  // ---- native collectives (algorithm::native) ----

  /// MPI_Allreduce of `count` elements (in == out: MPI_IN_PLACE). avg is
  /// MPI_SUM followed by a local division; f16/bf16 use dpkit's own MPI_Op
  /// (f32 arithmetic) on MPI_UINT16_T. Counts above INT_MAX are split.
  void native_allreduce(const void* in, void* out, std::size_t count, element_type t, reduce_op op) {
    const std::size_t es = element_size(t);
    for_counts(count, [&](std::size_t off, int n) {
      const auto* i = static_cast<const std::byte*>(in) + off * es;
      auto* o = static_cast<std::byte*>(out) + off * es;
      detail::mpi_check(MPI_Allreduce(i == o ? MPI_IN_PLACE : i, o, n, datatype(t), mpi_op(t, op), comm_),
                        "MPI_Allreduce", rank_);
    });
    if (op == reduce_op::avg) finish_avg(out, count, t);
  }
  /// MPI_Reduce_scatter_block: `count` = elements per rank of the output.
  /// In place follows NCCL: out == in + rank * count (the result lands in
  /// this rank's chunk; MPI_IN_PLACE puts it at the front, so it is moved
  /// there and the front chunk is left unspecified).
  /// @throws dpkit::invalid_argument if count > INT_MAX.
  void native_reduce_scatter(const void* in, void* out, std::size_t count, element_type t, reduce_op op) {
    check_int(count, "MPI_Reduce_scatter_block");
    const std::size_t es = element_size(t);
    const auto* own = static_cast<const std::byte*>(in) + static_cast<std::size_t>(rank_) * count * es;
    if (own == out) {
      auto* buf = const_cast<void*>(in);
      detail::mpi_check(MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, static_cast<int>(count), datatype(t),
                                                 mpi_op(t, op), comm_),
                        "MPI_Reduce_scatter_block", rank_);
      if (buf != out && count) std::memmove(out, buf, count * es);
    } else {
      detail::mpi_check(MPI_Reduce_scatter_block(in, out, static_cast<int>(count), datatype(t), mpi_op(t, op), comm_),
                        "MPI_Reduce_scatter_block", rank_);
    }
    if (op == reduce_op::avg) finish_avg(out, count, t);
  }
  /// MPI_Allgather: `count` = elements per rank of the input; in place when
  /// in == out + rank * count (NCCL's convention).
  /// @throws dpkit::invalid_argument if count > INT_MAX.
  void native_allgather(const void* in, void* out, std::size_t count, element_type t) {
    check_int(count, "MPI_Allgather");
    const auto* o = static_cast<const std::byte*>(out) + static_cast<std::size_t>(rank_) * count * element_size(t);
    detail::mpi_check(MPI_Allgather(in == o ? MPI_IN_PLACE : in, static_cast<int>(count), datatype(t), out,
                                    static_cast<int>(count), datatype(t), comm_),
                      "MPI_Allgather", rank_);
  }
  /// MPI_Bcast from root (copies in -> out on root first when they differ).
  void native_broadcast(const void* in, void* out, std::size_t count, element_type t, int root) {
    if (rank_ == root && in != out && count) std::memcpy(out, in, count * element_size(t));
    const std::size_t es = element_size(t);
    for_counts(count, [&](std::size_t off, int n) {
      detail::mpi_check(MPI_Bcast(static_cast<std::byte*>(out) + off * es, n, datatype(t), root, comm_), "MPI_Bcast",
                        rank_);
    });
  }
  /// MPI_Reduce to root (out is used on root only; counts above INT_MAX are split).
  void native_reduce(const void* in, void* out, std::size_t count, element_type t, reduce_op op, int root) {
    const std::size_t es = element_size(t);
    for_counts(count, [&](std::size_t off, int n) {
      const auto* i = static_cast<const std::byte*>(in) + off * es;
      auto* o = rank_ == root ? static_cast<std::byte*>(out) + off * es : nullptr;
      const void* send = (rank_ == root && i == o) ? MPI_IN_PLACE : static_cast<const void*>(i);
      detail::mpi_check(MPI_Reduce(send, o, n, datatype(t), mpi_op(t, op), root, comm_), "MPI_Reduce", rank_);
    });
    if (op == reduce_op::avg && rank_ == root) finish_avg(out, count, t);
  }
  /// MPI_Barrier.
  void native_barrier() { detail::mpi_check(MPI_Barrier(comm_), "MPI_Barrier", rank_); }

private:
  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size_)
      throw invalid_argument(std::string("mpi::") + what + ": rank " + std::to_string(rank_) + ": peer rank " +
                             std::to_string(peer) + " out of range for world size " + std::to_string(size_));
  }
  void check_int(std::size_t count, const char* call) const {
    if (count > static_cast<std::size_t>(INT_MAX))
      throw invalid_argument(std::string(call) + ": rank " + std::to_string(rank_) + ": count " +
                             std::to_string(count) + " exceeds INT_MAX");
  }
  // Posts one request per <= 1 GiB piece via post(offset, bytes, &request).
  template <class Post>
  mpi_request start(std::size_t bytes, int peer, int tag, bool is_send, Post&& post) {
    MPI_Request first = MPI_REQUEST_NULL;
    std::vector<MPI_Request> more;
    for_pieces(bytes, [&](std::size_t off, int n) {
      MPI_Request r;
      post(off, n, &r);
      if (off == 0) first = r;
      else more.push_back(r);
    });
    return mpi_request(first, std::move(more), rank_, peer, tag, is_send);
  }
  template <class F>
  static void for_pieces(std::size_t bytes, F&& f) {
    if (bytes == 0) {
      f(0, 0);
      return;
    }
    for (std::size_t off = 0; off < bytes; off += detail::mpi_max_message)
      f(off, static_cast<int>(std::min(detail::mpi_max_message, bytes - off)));
  }
  template <class F>
  static void for_counts(std::size_t count, F&& f) {
    const std::size_t step = static_cast<std::size_t>(INT_MAX);
    for (std::size_t off = 0; off < count; off += step) f(off, static_cast<int>(std::min(step, count - off)));
  }
  static MPI_Datatype datatype(element_type t) {
    switch (t) {
    case element_type::f32: return MPI_FLOAT;
    case element_type::f64: return MPI_DOUBLE;
    case element_type::f16: case element_type::bf16: return MPI_UINT16_T;
    case element_type::i8: return MPI_INT8_T;
    case element_type::u8: return MPI_UINT8_T;
    case element_type::i32: return MPI_INT32_T;
    case element_type::u32: return MPI_UINT32_T;
    case element_type::i64: return MPI_INT64_T;
    case element_type::u64: return MPI_UINT64_T;
    }
    return MPI_BYTE;
  }
  MPI_Op mpi_op(element_type t, reduce_op op) const {
    if (t == element_type::f16 || t == element_type::bf16) {
      const std::size_t idx = (t == element_type::bf16 ? 4u : 0u) + static_cast<std::size_t>(op == reduce_op::avg ? reduce_op::sum : op);
      return half_ops_[idx];
    }
    switch (op) {
    case reduce_op::sum: case reduce_op::avg: return MPI_SUM;
    case reduce_op::prod: return MPI_PROD;
    case reduce_op::min: return MPI_MIN;
    case reduce_op::max: return MPI_MAX;
    }
    return MPI_SUM;
  }
  void finish_avg(void* out, std::size_t count, element_type t) const {
    visit_element_type(t, [&](auto v) {
      using T = decltype(v);
      divide_host(static_cast<T*>(out), count, static_cast<std::size_t>(size_));
    });
  }
  template <class H, reduce_op Op>
  static void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
    reduce_host(static_cast<H*>(inout), static_cast<const H*>(inout), static_cast<const H*>(in),
                static_cast<std::size_t>(*len), Op);
  }
  void create_half_ops() {
    half_ops_.fill(MPI_OP_NULL);
    const auto make = [&](std::size_t i, MPI_User_function* f) { detail::mpi_check(MPI_Op_create(f, 1, &half_ops_[i]), "MPI_Op_create", rank_); };
    make(0, &half_op<f16, reduce_op::sum>);
    make(1, &half_op<f16, reduce_op::prod>);
    make(2, &half_op<f16, reduce_op::min>);
    make(3, &half_op<f16, reduce_op::max>);
    make(4, &half_op<bf16, reduce_op::sum>);
    make(5, &half_op<bf16, reduce_op::prod>);
    make(6, &half_op<bf16, reduce_op::min>);
    make(7, &half_op<bf16, reduce_op::max>);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0, size_ = 0;
  std::array<MPI_Op, 8> half_ops_{};
  std::unique_ptr<detail::scratch_arena> arena_ = std::make_unique<detail::scratch_arena>();
  std::unique_ptr<progress_thread> progress_ = std::make_unique<progress_thread>();
};

} // namespace dpkit
