/// @file symmetric_memory.hpp
/// @brief `allocate_symmetric(comm, bytes)`: host memory that every rank of a
/// node maps, one region per rank (symmetric memory: the same allocation,
/// made collectively, on every rank, as ncclMemAlloc with
/// ncclCommWindowRegister, nvshmem_malloc or torch's SymmetricMemory). An
/// all-reduce whose buffers lie in such memory on every rank reads its peers'
/// inputs and writes their outputs directly (allreduce_shm's direct path,
/// shm/allreduce.hpp): one pass over memory instead of the two copies through
/// the shared segment. `register_memory(comm, p, bytes)` does the same for a
/// buffer the caller already has (its whole pages). Buffers anywhere else run
/// the two-shot as before.
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
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include <sys/mman.h>

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

namespace detail {

/// The distance in bytes between two ranks' regions of a window whose
/// regions hold `bytes` bytes: whole 4096-byte pages, an odd number of them,
/// or from 16 MiB a number that is 0x55 modulo 256. AMD Zen's L1 way
/// predictor tags lines by a hash of linear address bits 12-27, so lines
/// whose distance leaves that hash unchanged evict each other:
/// - exactly 256 MiB apart, the direct all-reduce of 1 MiB took 738 us
///   against 37 us one page further; hence an odd number of pages
///   (benchmarks/results/2026-12-04-symmetric-direct.md);
/// - 64 MiB + 4 KiB and 128 MiB + 4 KiB apart (what the odd-page rule gives
///   regions of 64 and 128 MiB), its in-place kernel over 64 MiB took 10.5
///   and 15.4 ms against 2.5-3.0 ms at distances whose page count is 0x55
///   modulo 256 (64-512 MiB, benchmarks/results/2026-12-04-symmetric-stride.md).
/// The 0x55 rule adds at most 255 pages (1020 KiB) per rank.
inline std::size_t symmetric_stride(std::size_t bytes) noexcept {
  std::size_t pages = (bytes + 4095) / 4096;
  if (pages >= 4096) pages += (0x55 + 256 - pages % 256) % 256;
  else if (pages % 2 == 0) ++pages;
  return pages * 4096;
}

/// Creates (rank 0) and maps (every rank) one POSIX shared-memory object of
/// world size x `stride` bytes into `map`, collectively, and unlinks its
/// name once every rank has it (nothing stays in /dev/shm after a kill).
/// @returns the lowest rank that could not create, open or map it (its
///          reason in `why` on that rank), or the world size when every rank
///          mapped it; the same value on every rank.
/// @throws what the setup's collectives throw (a broadcast of the name, an
///         all-reduce), the name unlinked.
template <transport C>
std::int64_t map_symmetric_object(C& comm, std::size_t stride, const collective_options& o, shm_mapping& map,
                                  std::string& why) {
  const int rank = comm.rank(), n = comm.size();
  const std::size_t total = stride * static_cast<std::size_t>(n);
  // rank 0's object name, or an empty name when it could not create one
  std::array<std::uint8_t, 128> name{};
  std::string created;
  if (rank == 0) {
    try {
      created = shm_mapping::unique_name("win");
      map = shm_mapping::create(created, total);
      std::memcpy(name.data(), created.data(), std::min(created.size(), name.size() - 1));
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  try {
    broadcast(comm, name, 0, algorithm::automatic, o);
  } catch (...) {
    if (rank == 0 && !created.empty()) shm_mapping::unlink(created);
    throw;
  }
  const std::string opened(reinterpret_cast<const char*>(name.data()));
  if (rank != 0 && !opened.empty()) {
    try {
      map = shm_mapping::open(opened, total);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  std::array<std::int64_t, 1> first_bad{why.empty() && !opened.empty() ? n : rank};
  try {
    allreduce(comm, first_bad, reduce_op::min, allreduce_policy{}, o);
  } catch (...) {
    if (rank == 0 && !created.empty()) shm_mapping::unlink(created);
    throw;
  }
  if (rank == 0 && !created.empty()) shm_mapping::unlink(created);
  return first_bad[0];
}

/// One line of /proc/self/maps: the mapping [start, end) of the file (device,
/// inode; 0 for anonymous memory) from byte `offset`.
struct mapping_line {
  std::uintptr_t start = 0, end = 0;
  std::uint64_t offset = 0, inode = 0;
  unsigned dev_major = 0, dev_minor = 0;
};

/// The mapping of this process that holds address `p`, read from
/// /proc/self/maps; nullopt when none does or the file cannot be read.
inline std::optional<mapping_line> mapping_at(const void* p) {
  std::FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return std::nullopt;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::optional<mapping_line> found;
  char line[4096];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    mapping_line m;
    unsigned long long start = 0, end = 0, offset = 0, inode = 0;
    char perms[8];
    if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &start, &end, perms, &offset, &m.dev_major, &m.dev_minor,
                    &inode) != 7)
      continue;
    if (a < start || a >= end) continue;
    m.start = static_cast<std::uintptr_t>(start);
    m.end = static_cast<std::uintptr_t>(end);
    m.offset = offset;
    m.inode = inode;
    found = m;
    break;
  }
  std::fclose(f);
  return found;
}

/// True when the `bytes` bytes at `user` are one mapping of the same pages
/// of the same file as the `bytes` bytes at `view` (register_memory's
/// remapped pages are still the caller's, not freed and mapped again).
inline bool maps_same_pages(const void* user, const void* view, std::size_t bytes) {
  const auto u = mapping_at(user), v = mapping_at(view);
  if (!u || !v || u->inode == 0 || u->inode != v->inode || u->dev_major != v->dev_major ||
      u->dev_minor != v->dev_minor)
    return false;
  const auto ua = reinterpret_cast<std::uintptr_t>(user), va = reinterpret_cast<std::uintptr_t>(view);
  return u->end - ua >= bytes && u->offset + (ua - u->start) == v->offset + (va - v->start);
}

/// Replaces the mapping of the `bytes` bytes at `at` (whole pages) with
/// private anonymous memory holding a copy of the `bytes` bytes at `from`,
/// in one step (mremap onto `at`: no moment where `at` is unmapped).
/// @returns false, `at` left as it was, when the memory cannot be had.
inline bool remap_private_copy(std::byte* at, const std::byte* from, std::size_t bytes) noexcept {
  void* tmp = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp == MAP_FAILED) return false;
  std::memcpy(tmp, from, bytes);
  if (::mremap(tmp, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, at) == MAP_FAILED) {
    ::munmap(tmp, bytes);
    return false;
  }
  return true;
}

} // namespace detail

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
  // regions a distance apart that no two ranks' lines alias at (symmetric_stride)
  const std::size_t stride = detail::symmetric_stride(bytes);
  std::string why;
  const std::int64_t first_bad = detail::map_symmetric_object(comm, stride, o, m.map_, why);
  if (first_bad < n) {
    if (fallback == symmetric_fallback::private_memory) {
      m.map_ = detail::shm_mapping{}; // unmap what this rank mapped; the window id stays unused on every rank
      make_private();
      return m;
    }
    throw error(who + ": the symmetric memory (" + std::to_string(stride * static_cast<std::size_t>(n)) +
                " bytes) could not be set up: " +
                (why.empty() ? "rank " + std::to_string(first_bad) + " failed (its error names the reason)" : why));
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

class registered_memory;

template <transport C>
registered_memory register_memory(C& comm, void* p, std::size_t bytes, const collective_options& o = {});

/// A buffer of the caller's made symmetric where it lies (register_memory):
/// the whole 4096-byte pages inside it are remapped onto this rank's region
/// of a window that every rank of the node maps, so an all-reduce on the
/// buffer (or any part of it) runs the shm all-reduce's direct path over
/// those pages and the two-shot only over the bytes before the first and
/// after the last whole page. Move-only. release() or the destructor puts
/// private memory with the same contents back under the pages (unless they
/// are no longer this registration's: freed and mapped again by someone
/// else, in which case nothing is written there). While registered, the
/// pages are shared memory: a child made by fork() shares them with the
/// parent (private memory would be copied on write).
class registered_memory {
public:
  registered_memory() = default;
  registered_memory(registered_memory&& o) noexcept { swap(o); }
  registered_memory& operator=(registered_memory&& o) noexcept {
    if (this != &o) {
      registered_memory tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  registered_memory(const registered_memory&) = delete;
  registered_memory& operator=(const registered_memory&) = delete;
  ~registered_memory() { release(); }

  /// True while the pages lie in a window (the node's ranks map them).
  bool shared() const noexcept { return registry_ != nullptr; }
  /// The first remapped byte (4096-byte aligned, inside the buffer), or
  /// nullptr when nothing is registered.
  std::byte* pages() const noexcept { return shared() ? user_ : nullptr; }
  /// The number of remapped bytes (whole pages; 0 when nothing is registered).
  std::size_t page_bytes() const noexcept { return shared() ? bytes_ : 0; }

  /// Ends the registration on this rank: collectives stop treating the
  /// buffer as symmetric, and its pages become private memory again with the
  /// contents they have now. Not collective, but no collective on the buffer
  /// may run meanwhile, on any rank: call it on every rank after the last.
  /// Where the pages were freed (and perhaps mapped again) while registered,
  /// nothing is written to them. Never throws; where private memory cannot
  /// be had (mmap fails), the pages stay shared (their contents intact).
  void release() noexcept {
    if (!registry_) return;
    registry_->remove(id_);
    registry_.reset();
    if (detail::maps_same_pages(user_, view_, bytes_)) (void)detail::remap_private_copy(user_, view_, bytes_);
    map_ = detail::shm_mapping{};
  }

private:
  template <transport C>
  friend registered_memory register_memory(C& comm, void* p, std::size_t bytes, const collective_options& o);
  void swap(registered_memory& o) noexcept {
    std::swap(map_, o.map_);
    std::swap(registry_, o.registry_);
    std::swap(id_, o.id_);
    std::swap(user_, o.user_);
    std::swap(view_, o.view_);
    std::swap(bytes_, o.bytes_);
  }

  detail::shm_mapping map_; // every rank's region
  std::shared_ptr<detail::shm_window_registry> registry_;
  std::uint64_t id_ = 0;
  std::byte* user_ = nullptr; // the caller's first whole page
  std::byte* view_ = nullptr; // this rank's region in map_
  std::size_t bytes_ = 0;     // whole pages from user_
};

/// Registers the caller's buffer of `bytes` bytes at `p` as symmetric
/// memory on every rank of comm (collective: every rank calls it, in the
/// same order relative to its other register_memory and allocate_symmetric
/// calls; the byte counts and addresses may differ). Where comm has a
/// shared segment (one node), rank 0 creates one POSIX shared-memory object
/// with one region per rank, each rank copies the whole 4096-byte pages
/// inside its buffer into its region and maps the region over them (mremap:
/// the address and the contents stay, the pages become the region's), and
/// every rank maps every region. An all-reduce on the buffer then runs
/// direct over those pages (shm/allreduce.hpp), as on allocate_symmetric's
/// memory; the bytes before the first and after the last whole page (up to
/// 4095 each) run the two-shot. The purpose is the same as
/// ncclCommRegister's or torch's symmetric-memory rendezvous: buffers the
/// caller already has (a framework's gradient buckets) reach the one-pass
/// all-reduce without being allocated by dpkit.
///
/// Preconditions: [p, p + bytes) is readable and writable memory of the
/// caller's, not written by anyone during the call, and not freed or
/// unmapped before release() on this rank (freeing it first is detected at
/// release, but an all-reduce on memory mapped again at the same address in
/// between would read the old pages: undefined, as with NCCL's).
/// @param p,bytes the buffer (bytes 0, or too small to hold one whole page
///              on some rank: nothing is registered on any rank).
/// @param o     timeout and tag of the setup's collectives.
/// @returns the registration (shared() true), or an empty one (shared()
///          false, the buffer untouched) on every rank when a rank has no
///          whole page, comm has no shared segment (ranks on several nodes,
///          DPKIT_SHM_BYTES=0), or a rank could not create, map or remap the
///          object (a /dev/shm too small: then the buffers stay private).
/// @throws dpkit::invalid_argument naming the rank when p is null with bytes
///         > 0, the ranks are at different allocations (another rank
///         registered or allocated more or fewer windows so far), or a rank's
///         buffer overlaps symmetric memory it holds (a registration not
///         released, allocate_symmetric's memory; every rank throws); what
///         the setup's collectives throw.
template <transport C>
registered_memory register_memory(C& comm, void* p, std::size_t bytes, const collective_options& o) {
  const int rank = comm.rank(), n = comm.size();
  const std::string who = "register_memory: rank " + std::to_string(rank);
  if (p == nullptr && bytes > 0) throw invalid_argument(who + ": null buffer of " + std::to_string(bytes) + " bytes");
  const auto a = (reinterpret_cast<std::uintptr_t>(p) + 4095) / 4096 * 4096;
  const auto e = (reinterpret_cast<std::uintptr_t>(p) + bytes) / 4096 * 4096;
  const std::size_t len = p != nullptr && e > a ? static_cast<std::size_t>(e - a) : 0;
  const bool has_shm = detail::shm_available(comm);
  std::shared_ptr<detail::shm_window_registry> reg;
  if constexpr (shared_memory_transport<C>)
    if (has_shm) reg = comm.shm()->windows();
  const std::uint64_t id = reg ? reg->next_id() : 0;
  // pages already in a window here (registered before, or allocate_symmetric's):
  // remapping them again would leave the other window's regions stale
  const bool overlaps = reg && len > 0 && reg->cover(p, bytes, rank, 1).id != 0;
  // agree on the largest and smallest page count, the window id, and the
  // highest rank whose buffer overlaps a window (+1; 0: none)
  std::array<std::uint64_t, 5> agree{len, ~static_cast<std::uint64_t>(len), id, ~id,
                                     overlaps ? static_cast<std::uint64_t>(rank) + 1 : 0};
  allreduce(comm, agree, reduce_op::max, allreduce_policy{}, o);
  if (agree[2] != ~agree[3])
    throw invalid_argument(who + ": ranks are at different allocations (this rank's is window " + std::to_string(id) +
                           ", others' from " + std::to_string(~agree[3]) + " to " + std::to_string(agree[2]) +
                           "): every rank must call register_memory and allocate_symmetric in the same order");
  if (agree[4] != 0)
    throw invalid_argument(who + ": rank " + std::to_string(agree[4] - 1) +
                           "'s buffer lies in symmetric memory already (registered or from allocate_symmetric); "
                           "release it first");
  registered_memory m;
  if (!reg || ~agree[1] == 0) return m; // a rank without a whole page, or no segment: nothing registered
  const std::size_t stride = detail::symmetric_stride(static_cast<std::size_t>(agree[0]));
  std::string why;
  if (detail::map_symmetric_object(comm, stride, o, m.map_, why) < n) {
    m.map_ = detail::shm_mapping{};
    return m; // the window id stays unused on every rank
  }
  std::byte* const base = m.map_.data();
  std::byte* const view = base + stride * static_cast<std::size_t>(rank);
  std::byte* const user = reinterpret_cast<std::byte*>(a);
  // the caller's pages into the region, then the region's pages onto the
  // caller's address (a second mapping of the same shared pages: mremap
  // with old size 0 replaces what was there in one step)
  std::memcpy(view, user, len);
  bool ok = ::mremap(view, 0, len, MREMAP_MAYMOVE | MREMAP_FIXED, user) != MAP_FAILED;
  if (!ok && !detail::mapping_at(user)) // (a failed mremap that left the range unmapped)
    (void)detail::remap_private_copy(user, view, len);
  std::array<std::int64_t, 1> all_ok{ok ? 1 : 0};
  try {
    allreduce(comm, all_ok, reduce_op::min, allreduce_policy{}, o);
  } catch (...) {
    if (ok) (void)detail::remap_private_copy(user, view, len);
    throw;
  }
  if (all_ok[0] == 0) {
    if (ok) (void)detail::remap_private_copy(user, view, len);
    m.map_ = detail::shm_mapping{};
    return m;
  }
  for (int q = 0; q < n; ++q)
    if (q != rank) detail::shm_touch_pages(base + stride * static_cast<std::size_t>(q), stride, false);
  reg->add({id, base, stride, len, user});
  m.registry_ = std::move(reg);
  m.id_ = id;
  m.user_ = user;
  m.view_ = view;
  m.bytes_ = len;
  return m;
}

} // namespace dpkit
