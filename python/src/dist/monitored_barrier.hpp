// dpkit._dist_ext: the group's health for torch's debugging tools: the
// monitored barrier (torch.distributed.monitored_barrier: rank 0 names the
// ranks that did not arrive) and the group's sequence number (what
// TORCH_DISTRIBUTED_DEBUG=DETAIL's checks compare across ranks).
// ProcessGroupGloo's semantics and messages.
#pragma once

#include "p2p.hpp"

#include <map>

namespace dpkit_dist {

/// Every rank but 0 sends rank 0 a word and waits for its answer; rank 0
/// waits for each rank's word (in rank order, within `opts.timeout`, else
/// the group's timeout), then answers all. A rank whose word does not come
/// in time: rank 0 raises "[Rank 0]: Rank R failed to pass monitoredBarrier
/// in T ms" (with `wait_all_ranks`, after waiting for every rank: "Ranks
/// R1, R2 failed to pass ..."; with no time left before a rank's turn:
/// "Rank 0 timed out in monitoredBarrier after T ms"), and fails the group,
/// as Gloo's timed-out wait closes its pairs: the others then raise "Rank R
/// successfully reached monitoredBarrier, but received errors while waiting
/// for send/recv from rank 0" at once. Its messages use tags of the
/// backend's own, never a user's.
inline void process_group_dpkit::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const auto timeout = opts.timeout.count() >= 0 ? opts.timeout : timeout_; // unset: -1 (0 is no time at all)
  int t1 = 0, t2 = 0;
  {
    const std::lock_guard lk(p2p_mu_);
    t1 = internal_tag_base + static_cast<int>((2 * internal_tags_) % internal_tag_base);
    t2 = t1 + 1;
    ++internal_tags_;
  }
  const int rank = getRank(), size = getSize();
  auto word = [&] { return at::tensor({static_cast<std::int64_t>(rank)}); };
  auto wait = [](const c10::intrusive_ptr<c10d::Work>& w, std::chrono::milliseconds ms) { w->wait(ms); };
  if (rank != 0) {
    const at::Tensor sent = word(), got = word();
    try {
      auto s = post_p2p(true, sent, 0, t1, c10d::OpType::SEND, "rank " + std::to_string(rank) + ": monitored barrier");
      auto r = post_p2p(false, got, 0, t2, c10d::OpType::RECV, "rank " + std::to_string(rank) + ": monitored barrier");
      wait(s, ::kNoTimeout);
      wait(r, ::kNoTimeout);
    } catch (const std::exception& e) {
      throw dpkit::peer_error("Rank " + std::to_string(rank) +
                              " successfully reached monitoredBarrier, but received errors while waiting for send/recv "
                              "from rank 0. Please check rank 0 logs for faulty rank.\n Original exception: \n" +
                              e.what());
    }
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto remaining = [&]() -> std::chrono::milliseconds {
    if (wait_all_ranks) return timeout;
    return std::chrono::duration_cast<std::chrono::milliseconds>(timeout - (std::chrono::steady_clock::now() - start));
  };
  // fails the group first (the ranks waiting for rank 0's answer raise at once)
  const auto fail = [&](const std::string& what) {
    fail_group(what);
    throw dpkit::timeout_error(what);
  };
  const auto failed = [&](const std::string& who) {
    return "[Rank 0]: " + who + " failed to pass monitoredBarrier in " + std::to_string(timeout.count()) + " ms";
  };
  std::vector<int> passed;
  std::map<int, std::pair<at::Tensor, c10::intrusive_ptr<c10d::Work>>> recvs;
  for (int p = 1; p < size; ++p) {
    at::Tensor t = word();
    recvs.emplace(p, std::make_pair(t, post_p2p(false, t, p, t1, c10d::OpType::RECV, "rank 0: monitored barrier")));
  }
  std::vector<int> missing;
  for (auto& [p, rw] : recvs) {
    const auto left = remaining();
    if (!wait_all_ranks && left.count() <= 0) {
      std::string done;
      for (int q : passed) done += (done.empty() ? "" : ", ") + std::to_string(q);
      fail("Rank 0 timed out in monitoredBarrier after " + std::to_string(timeout.count()) + " ms.\n" +
           (done.empty() ? "No ranks successfully processed in monitoredBarrier." : "Successfully processed ranks: " + done));
    }
    try {
      wait(rw.second, std::max(left, std::chrono::milliseconds(1))); // 0 would be "no timeout"
      passed.push_back(p);
    } catch (const std::exception& e) {
      if (!wait_all_ranks) fail(failed("Rank " + std::to_string(p)) + "\n Original exception: \n" + e.what());
      missing.push_back(p);
    }
  }
  if (!missing.empty()) {
    std::string who;
    for (int p : missing) who += (who.empty() ? "" : ", ") + std::to_string(p);
    fail(failed("Ranks " + who));
  }
  std::vector<std::pair<at::Tensor, c10::intrusive_ptr<c10d::Work>>> sends;
  for (int p = 1; p < size; ++p) {
    at::Tensor t = word();
    sends.emplace_back(t, post_p2p(true, t, p, t2, c10d::OpType::SEND, "rank 0: monitored barrier"));
  }
  for (std::size_t k = 0; k < sends.size(); ++k) {
    try {
      wait(sends[k].second, remaining().count() > 0 ? remaining() : std::chrono::milliseconds(1));
    } catch (const std::exception& e) {
      fail(failed("Rank " + std::to_string(k + 1)) + "\n Original exception: \n" + e.what());
    }
  }
}

/// Gloo's rule: sequence numbers start at 0 on every rank (nothing to
/// agree on).
inline void process_group_dpkit::setSequenceNumberForGroup() {}

/// The number of operations started on this group (collectives, sends and
/// receives), as ProcessGroupGloo counts them: equal on every rank that
/// issued the same operations.
inline uint64_t process_group_dpkit::getSequenceNumberForGroup() {
  const std::lock_guard lk(mu_);
  return seq_;
}

} // namespace dpkit_dist
