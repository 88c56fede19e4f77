// dpkit internals: a per-transport cache of host scratch buffers, so a
// collective does not mmap, page-fault and zero fresh scratch on every call
// (measured: ~100 us per 1 MiB call on the reference machine). One collective
// at a time leases the arena; a concurrent collective on the same transport
// falls back to its own allocation. Not for users.
#pragma once

#include <atomic>
#include <new>
#include <cstddef>
#include <memory>

namespace dpkit::detail {

class scratch_arena {
public:
  static constexpr int slots = 2;
  /// Frees arena storage.
  struct deleter {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
  };

  /// RAII lease; buffer(i, bytes) returns >= bytes of 64-byte aligned storage
  /// that stays valid for the lease (and is reused by later leases).
  class lease {
  public:
    explicit lease(scratch_arena* a) : a_(a && !a->busy_.exchange(true, std::memory_order_acquire) ? a : nullptr) {}
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() {
      if (a_) a_->busy_.store(false, std::memory_order_release);
    }
    /// Storage for slot i (< slots) of at least `bytes` bytes.
    std::byte* buffer(int i, std::size_t bytes) {
      if (bytes == 0) return nullptr;
      auto& b = a_ ? a_->buf_[i] : own_[i];
      auto& cap = a_ ? a_->cap_[i] : own_cap_[i];
      if (cap < bytes) {
        b.reset(static_cast<std::byte*>(::operator new(bytes, std::align_val_t{64})));
        cap = bytes;
      }
      return b.get();
    }

  private:
    scratch_arena* a_;
    std::unique_ptr<std::byte, scratch_arena::deleter> own_[slots];
    std::size_t own_cap_[slots] = {};
  };

private:
  std::atomic<bool> busy_{false};
  std::unique_ptr<std::byte, deleter> buf_[slots];
  std::size_t cap_[slots] = {};
};

} // namespace dpkit::detail
