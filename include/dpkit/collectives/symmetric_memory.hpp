/// @file symmetric_memory.hpp
/// @brief `allocate_symmetric(comm, bytes)`: host memory that every rank of a
/// node maps, one region per rank (symmetric memory: the same allocation,
/// made collectively, on every rank, as ncclMemAlloc with
/// ncclCommWindowRegister, nvshmem_malloc or torch's SymmetricMemory). An
/// all-reduce whose buffers lie in such memory on every rank reads its peers'
/// inputs and writes their outputs directly (allreduce_shm's direct path,
/// shm/allreduce.hpp): one pass over memory instead of the two copies through
/// the shared segment. Buffers anywhere else run the two-shot as before.
#pragma once

#include "allreduce.hpp"
#include "broadcast.hpp"
#include "../transport/detail/shm_mapping.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace dpkit {

class symmetric_memory;

/// What allocate_symmetric does when the node cannot hold the shared object
/// (a rank cannot create, reserve or map it: /dev/shm smaller than the
/// allocation, as Docker's default 64 MiB).
enum class symmetric_fallback {
  none,           ///< throw dpkit::error on every rank (the default)
  private_memory, ///< return private memory on every rank (shared() false), as without a shared segment
};

template <transport C>
symmetric_memory allocate_symmetric(C& comm, std::size_t bytes, const collective_options& o = {},
                                    symmetric_fallback fallback = symmetric_fallback::none);

/// This rank's part of a block of symmetric memory (allocate_symmetric):
/// `size()` bytes, 4096-byte aligned, zeroed, that the node's other ranks map
/// too (shared() true) or, on a transport without a shared segment (ranks on
/// several nodes, DPKIT_SHM_BYTES=0), private memory of the same size
/// (shared() false: collectives on it run as on any buffer). Move-only; the
/// destructor unmaps it here (the memory lives until every rank freed its
/// part). Free it on every rank only when no collective uses it any more;
/// it may outlive the transport.
class symmetric_memory {
public:
  symmetric_memory() = default;
  symmetric_memory(symmetric_memory&& o) noexcept { swap(o); }
  symmetric_memory& operator=(symmetric_memory&& o) noexcept {
    if (this != &o) {
      symmetric_memory tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  symmetric_memory(const symmetric_memory&) = delete;
  symmetric_memory& operator=(const symmetric_memory&) = delete;
  ~symmetric_memory() {
    if (registry_) registry_->remove(id_);
    if (private_) ::operator delete[](private_, std::align_val_t{4096});
  }

  /// This rank's bytes (nullptr when default-constructed or moved from).
  std::byte* data() const noexcept { return data_; }
  /// Their count, as allocated.
  std::size_t size() const noexcept { return bytes_; }
  /// True when the node's ranks map this memory (the direct all-reduce can
  /// run on it).
  bool shared() const noexcept { return registry_ != nullptr; }
  /// The bytes as `size() / sizeof(T)` elements of T (T trivially copyable;
  /// the data is 4096-byte aligned).
  template <class T>
  std::span<T> as() const noexcept {
    static_assert(std::is_trivially_copyable_v<T>);
    return {reinterpret_cast<T*>(data_), bytes_ / sizeof(T)};
  }

private:
  template <transport C>
  friend symmetric_memory allocate_symmetric(C& comm, std::size_t bytes, const collective_options& o,
                                             symmetric_fallback fallback);
  void swap(symmetric_memory& o) noexcept {
    std::swap(map_, o.map_);
    std::swap(registry_, o.registry_);
    std::swap(id_, o.id_);
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(private_, o.private_);
  }

  detail::shm_mapping map_;
  std::shared_ptr<detail::shm_window_registry> registry_;
  std::uint64_t id_ = 0;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::byte* private_ = nullptr; // without a shared segment
};

/// Allocates `bytes` bytes of symmetric memory on every rank of comm
/// (collective: every rank calls it, with the same byte count, in the same
/// order relative to its other allocate_symmetric calls and collectives).
/// Where comm has a shared segment (one node), rank 0 creates one POSIX
/// shared-memory object of world size x bytes (each rank's region rounded
/// up to 4096-byte pages: an odd number of them, or from 16 MiB a number
/// that is 0x55 modulo 256, so that no two ranks' lines alias in AMD Zen's
/// L1 way predictor), every rank maps all of it, and the name is unlinked once all have it (nothing
/// stays in /dev/shm after a kill); each rank writes its own region first
/// (its pages) and faults in its peers'. Elsewhere: private memory.
/// @param bytes per rank, > 0.
/// @param o     timeout and tag of the collectives the setup runs (an
///              all-reduce of four integers, a broadcast of the name, a
///              second all-reduce).
/// @param fallback what to do when a rank cannot create, reserve or map the
///              object: throw (none), or return private memory on every rank
///              (private_memory; the ranks agree, so all fall back together).
/// @returns this rank's region, zeroed.
/// @throws dpkit::invalid_argument naming the rank when bytes is 0 or the
///         ranks passed different byte counts or are not at the same
///         allocation (another rank allocated more or fewer windows so far);
///         dpkit::error naming the object and the system's reason when a rank
///         cannot create or map it (/dev/shm full: every rank throws) and
///         fallback is none;
///         std::bad_alloc (private memory); what the setup's collectives throw.
template <transport C>
symmetric_memory allocate_symmetric(C& comm, std::size_t bytes, const collective_options& o,
                                    symmetric_fallback fallback) {
  const int rank = comm.rank(), n = comm.size();
  const std::string who = "allocate_symmetric: rank " + std::to_string(rank);
  if (bytes == 0) throw invalid_argument(who + ": 0 bytes requested (expected > 0)");
  const bool has_shm = detail::shm_available(comm);
  std::shared_ptr<detail::shm_window_registry> reg;
  if constexpr (shared_memory_transport<C>)
    if (has_shm) reg = comm.shm()->windows();
  const std::uint64_t id = reg ? reg->next_id() : 0;
  // agree on the byte count and the window id: max and min of each (min as
  // the max of the complement)
  std::array<std::uint64_t, 4> agree{bytes, ~static_cast<std::uint64_t>(bytes), id, ~id};
  allreduce(comm, agree, reduce_op::max, allreduce_policy{}, o);
  if (agree[0] != ~agree[1])
    throw invalid_argument(who + ": ranks passed different byte counts (this rank " + std::to_string(bytes) +
                           ", others from " + std::to_string(~agree[1]) + " to " + std::to_string(agree[0]) + ")");
  if (agree[2] != ~agree[3])
    throw invalid_argument(who + ": ranks are at different allocations (this rank's is window " + std::to_string(id) +
                           ", others' from " + std::to_string(~agree[3]) + " to " + std::to_string(agree[2]) +
                           "): every rank must call allocate_symmetric in the same order");
  symmetric_memory m;
  m.bytes_ = bytes;
  auto make_private = [&m, bytes] {
    m.private_ = static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{4096}));
    std::memset(m.private_, 0, bytes);
    m.data_ = m.private_;
  };
  if (!reg) {
    make_private();
    return m;
  }
  // Where the ranks' regions start relative to each other. AMD Zen's L1 way
  // predictor tags lines by a hash of linear address bits 12-27, so lines
  // whose distance leaves that hash unchanged evict each other:
  // - exactly 256 MiB apart, the direct all-reduce of 1 MiB took 738 us
  //   against 37 us one page further; hence an odd number of pages
  //   (benchmarks/results/2026-12-04-symmetric-direct.md);
  // - 64 MiB + 4 KiB and 128 MiB + 4 KiB apart (what the odd-page rule gives
  //   regions of 64 and 128 MiB), its in-place kernel over 64 MiB took 10.5
  //   and 15.4 ms against 2.5-3.0 ms at distances whose page count is 0x55
  //   modulo 256 (64-512 MiB, benchmarks/results/2026-12-04-symmetric-stride.md).
  // Regions from 16 MiB therefore take a page count that is 0x55 modulo 256
  // (at most 255 pages, 1020 KiB, more); smaller ones an odd page count.
  std::size_t pages = (bytes + 4095) / 4096;
  if (pages >= 4096) pages += (0x55 + 256 - pages % 256) % 256;
  else if (pages % 2 == 0) ++pages;
  const std::size_t stride = pages * 4096;
  const std::size_t total = stride * static_cast<std::size_t>(n);
  // rank 0's object name, or an empty name when it could not create one
  std::array<std::uint8_t, 128> name{};
  std::string why, created;
  if (rank == 0) {
    try {
      created = detail::shm_mapping::unique_name("win");
      m.map_ = detail::shm_mapping::create(created, total);
      std::memcpy(name.data(), created.data(), std::min(created.size(), name.size() - 1));
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  broadcast(comm, name, 0, algorithm::automatic, o);
  const std::string opened(reinterpret_cast<const char*>(name.data()));
  if (rank != 0 && !opened.empty()) {
    try {
      m.map_ = detail::shm_mapping::open(opened, total);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  // the lowest rank that failed, or n when every rank mapped it
  std::array<std::int64_t, 1> first_bad{why.empty() && !opened.empty() ? n : rank};
  try {
    allreduce(comm, first_bad, reduce_op::min, allreduce_policy{}, o);
  } catch (...) {
    if (rank == 0 && !created.empty()) detail::shm_mapping::unlink(created);
    throw;
  }
  if (rank == 0 && !created.empty()) detail::shm_mapping::unlink(created);
  if (first_bad[0] < n) {
    if (fallback == symmetric_fallback::private_memory) {
      m.map_ = detail::shm_mapping{}; // unmap what this rank mapped; the window id stays unused on every rank
      make_private();
      return m;
    }
    throw error(who + ": the symmetric memory (" + std::to_string(total) + " bytes) could not be set up: " +
                (why.empty() ? "rank " + std::to_string(first_bad[0]) + " failed (its error names the reason)" : why));
  }
  std::byte* base = m.map_.data();
  m.data_ = base + stride * static_cast<std::size_t>(rank);
  detail::shm_touch_pages(m.data_, stride, true); // own pages first, by their owner
  for (int p = 0; p < n; ++p)
    if (p != rank) detail::shm_touch_pages(base + stride * static_cast<std::size_t>(p), stride, false);
  reg->add({id, base, stride, bytes});
  m.registry_ = std::move(reg);
  m.id_ = id;
  return m;
}

} // namespace dpkit
