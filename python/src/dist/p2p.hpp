// dpkit._dist_ext: point-to-point operations (torch's send, recv, isend,
// irecv, batch_isend_irecv, recv without a source), as ProcessGroupGloo:
// posted at once on the caller's thread (not queued behind the group's
// collectives), matched by (peer, tag) in posting order, completed by the
// Work's wait(). The data path is the transport's (the node's shared memory
// or TCP on the Gloo transport; MPI under mpirun).
//
// Tags: torch's tag t (0 <= t < 2^28) is the transport's tag user_tag_base +
// t, a range no collective uses (checked collective tags set bit 30; plain
// ones are collective_options::tag + [0, 16); 0-15 are reserved), so a
// user's messages never match a collective's.
#pragma once

#include "process_group.hpp"

namespace dpkit_dist {

/// The transport tag of torch's tag 0.
inline constexpr int user_tag_base = 1 << 29;
/// Tags of the backend's own messages (the monitored barrier's).
inline constexpr int internal_tag_base = 1 << 28;

inline void process_group_dpkit::fail_group(const std::string& why) {
  const std::lock_guard lk(mu_);
  if (stop_ || !has_comm()) return;
  std::visit([&](auto* p) { p->report_failure(why); }, comm());
}

/// Posts a send (`is_send`) or receive of t's bytes to or from `peer` (-1: a
/// receive from any rank) with `transport_tag`, and returns its Work.
inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::post_p2p(bool is_send, const at::Tensor& t, int peer,
                                                                  int transport_tag, c10d::OpType type,
                                                                  const std::string& what) {
  auto slot = std::make_shared<p2p_slot>();
  slot->tensor = t;
  slot->what = what;
  slot->source = peer;
  slot->due = std::chrono::steady_clock::now() + timeout_;
  slot->fail = [this](const std::string& why) { fail_group(why); };
  const std::span<std::byte> bytes(static_cast<std::byte*>(t.data_ptr()), nbytes(t));
  {
    const std::lock_guard lk(mu_);
    if (stop_ || !has_comm())
      throw dpkit::communicator_error(me() + what + ": the process group was shut down (destroy_process_group or "
                                             "interpreter exit)");
#if DPKIT_DIST_MPI
    if (mpi_ && !mpi_multiple_)
      throw dpkit::invalid_argument(me() + what + ": sends and receives run beside the group's worker thread and "
                                    "need MPI_THREAD_MULTIPLE; this MPI provides less");
#endif
    ++seq_;
    std::visit(
        [&](auto* c) {
          auto wrap = [&](auto r) -> std::unique_ptr<p2p_request> {
            return std::make_unique<p2p_request_of<decltype(r)>>(std::move(r), peer);
          };
          if (is_send) slot->request = wrap(c->isend(bytes, peer, transport_tag));
          else if (peer >= 0) slot->request = wrap(c->irecv(bytes, peer, transport_tag));
          else slot->request = wrap(c->irecv_any(bytes, transport_tag));
        },
        comm());
  }
  {
    // keep every pending one (a Work Python drops must not withdraw it);
    // forget those that completed since
    const std::lock_guard lk(p2p_mu_);
    std::erase_if(p2p_pending_, [](const std::shared_ptr<p2p_slot>& s) {
      const std::unique_lock slk(s->mu, std::try_to_lock);
      return slk.owns_lock() && s->settled();
    });
    p2p_pending_.push_back(slot);
  }
  return c10::make_intrusive<p2p_work>(getRank(), type, std::move(slot));
}

namespace detail_p2p {
/// The transport tag of torch's tag `tag`.
/// @throws dpkit::invalid_argument naming the tag and the rank.
inline int transport_tag(int tag, const std::string& me, const char* what) {
  if (tag < 0 || tag >= internal_tag_base)
    throw dpkit::invalid_argument(me + what + ": tag " + std::to_string(tag) + " out of range [0, " +
                                  std::to_string(internal_tag_base) + ")");
  return user_tag_base + tag;
}
inline std::string describe(int rank, const char* op, int peer, int tag, const at::Tensor& t) {
  return "rank " + std::to_string(rank) + ": " + op + (peer >= 0 ? " rank " + std::to_string(peer) : " any rank") +
         " (tag " + std::to_string(tag) + ", " + dpkit::detail::torch_describe(t) + ")";
}
} // namespace detail_p2p

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor t = single(tensors, "send");
  if (dst < 0 || dst >= getSize() || dst == getRank())
    throw dpkit::invalid_argument(me() + "send: destination rank " + std::to_string(dst) + " is not another rank of [0, " +
                                  std::to_string(getSize()) + ")");
  const int tt = detail_p2p::transport_tag(tag, me(), "send");
  return post_p2p(true, t, dst, tt, c10d::OpType::SEND, detail_p2p::describe(getRank(), "send to", dst, tag, t));
}

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor t = single(tensors, "recv");
  if (src < 0 || src >= getSize() || src == getRank())
    throw dpkit::invalid_argument(me() + "recv: source rank " + std::to_string(src) + " is not another rank of [0, " +
                                  std::to_string(getSize()) + ")");
  const int tt = detail_p2p::transport_tag(tag, me(), "recv");
  return post_p2p(false, t, src, tt, c10d::OpType::RECV, detail_p2p::describe(getRank(), "receive from", src, tag, t));
}

inline c10::intrusive_ptr<c10d::Work> process_group_dpkit::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const at::Tensor t = single(tensors, "recv");
  const int tt = detail_p2p::transport_tag(tag, me(), "recv");
  return post_p2p(false, t, -1, tt, c10d::OpType::RECVANYSOURCE,
                  detail_p2p::describe(getRank(), "receive from", -1, tag, t));
}

} // namespace dpkit_dist
