/// @file group.hpp
/// @brief Elastic membership over the Gloo transport (docs/elastic.md,
/// "Membership"): processes with stable ids form numbered generations
/// through a store; a generation's members are ranked densely by id (the
/// lowest live id is rank 0, the master); a failure makes every survivor's
/// collective throw, and the survivors rebuild under the next generation;
/// processes that join are admitted at a step boundary. Meson feature `gloo`;
/// never included by dpkit.hpp.
///
/// @code
/// dpkit::elastic_group group("file:///shared/job7", my_id, opts);
/// for (;;) {
///   compute_gradients();
///   try {
///     dpkit::allreduce(group.transport(), grads, dpkit::reduce_op::avg);
///   } catch (const dpkit::error&) {   // peer_error, timeout_error, ...
///     group.rebuild();                 // the step is discarded
///     continue;
///   }
///   optimizer_step();
///   group.admit_joiners();             // collective: all members call it
/// }
/// @endcode
///
/// Keys, under "dpkit/elastic" (file store) or "dpkit/<job>/elastic"
/// (Redis): `join/<k>` (the k-th process to arrive: its id; created once),
/// `hb/<id>` (a counter its heartbeat thread rewrites every
/// heartbeat_interval), `g/<t>/alive/<id>` (id takes part in forming
/// generation t), `g/<t>/members` (generation t's ids, ascending; created
/// once: the first proposal wins, so every process sees the same list),
/// `g/<t>/...` (the generation's Gloo rendezvous), `latest` (the newest
/// generation formed: where a new process starts).
#pragma once

#include "../collectives/allreduce_ring.hpp"
#include "../core/errors.hpp"
#include "../core/options.hpp"
#include "../transport/gloo.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace dpkit {

/// How an elastic_group forms its generations (a regular aggregate).
struct elastic_options {
  /// How each generation's transport connects (hostname, iface); its prefix
  /// and timeout are set by the group.
  gloo_options transport{};
  /// How often this process rewrites its heartbeat key.
  std::chrono::milliseconds heartbeat_interval{500};
  /// A process whose heartbeat this process saw unchanged for this long is
  /// dead (no clocks are compared: each observer times what it sees).
  std::chrono::milliseconds dead_after{5000};
  /// The longest forming a generation waits for a live candidate (a member
  /// of the generation before, a process that asked to join) to take part;
  /// then it goes on without it (that process joins a later generation).
  std::chrono::milliseconds announce_wait{30000};
  /// Limit of connecting one generation's transport (a member that died
  /// after it was chosen never arrives: the next generation is formed).
  std::chrono::milliseconds connect_timeout{60000};
  /// Limit of the whole join or rebuild. Default: env_default_timeout().
  std::chrono::milliseconds timeout = env_default_timeout();
  /// Fewest members a generation may have: forming waits (up to timeout)
  /// until this many live processes take part.
  int min_size = 1;
  /// Members the first generation of a job (generation 0) waits for: a job
  /// launched as N processes passes N, so that they start together. Values
  /// below min_size count as min_size.
  int first_size = 1;
  /// Quorum: a generation after the first forms only with a strict majority
  /// of the previous generation's members (more than half of them take
  /// part; joiners do not count). A network partition then leaves at most
  /// one side training: the minority's rebuild waits and throws
  /// timeout_error saying why, instead of going on apart (split brain). The
  /// same stops a group that lost half or more of its members at once
  /// (as etcd's and ZooKeeper's quorums). false: any min_size live
  /// processes go on.
  bool majority = true;
  /// Step deadline (0: off). With it, each member announces in the store
  /// when it enters a step's collectives (enter_step), and a member that
  /// another member waits for and that has not entered the step that one
  /// entered `step_deadline` ago is failed like a dead one: the waits on it
  /// end with peer_error and the next generation does not wait for it
  /// (though it is admitted again if it announces itself in time, or later
  /// as a joiner). This expels a member that stops making progress while its
  /// heartbeat lives (stuck in user code, a stopped device), which otherwise
  /// costs every peer its collective deadline. It must exceed how much later
  /// than the first member a healthy member enters a step (the spread of the
  /// members' compute times in one step).
  std::chrono::milliseconds step_deadline{0};
  friend bool operator==(const elastic_options&, const elastic_options&) = default;
};

/// A process's membership in an elastic group, and the transport of its
/// current generation. Not copyable or movable (its heartbeat thread refers
/// to it). One thread uses it (plus its heartbeat thread).
class elastic_group {
public:
  /// Joins the group `store_url` names as process `id`: appends id to the
  /// join queue, starts the heartbeat thread, and takes part in forming the
  /// next generation (the first one of a new job: once o.min_size processes
  /// arrived); returns once this process is a member of a generation whose
  /// transport is connected. A process joining a running group waits until
  /// its members call admit_joiners() (or rebuild()).
  /// @param store_url as gloo_transport (file:///dir, redis://host:port/job).
  /// @param id this process's id, unique in the job and never reused (a
  ///        restarted process takes a new one); ranks follow the ids' order.
  /// @throws dpkit::invalid_argument for a bad URL, id < 0, min_size < 1;
  ///         dpkit::timeout_error when no generation with this process forms
  ///         within o.timeout; dpkit::error when the store cannot be used;
  ///         dpkit::format_error when a key of the protocol holds garbage.
  elastic_group(const std::string& store_url, std::int64_t id, const elastic_options& o = {})
      : id_(id), o_(o) {
    if (id < 0) throw invalid_argument("elastic_group: id must be >= 0, got " + std::to_string(id));
    if (o.min_size < 1)
      throw invalid_argument("elastic_group: id " + std::to_string(id) + ": min_size must be >= 1, got " +
                             std::to_string(o.min_size));
    std::string prefix;
    store_ = detail::open_kv_store(store_url, "elastic_group: id " + std::to_string(id), o.connect_timeout, prefix);
    prefix_ = prefix + "/elastic/";
    beat();
    heartbeat_ = std::thread([this] { heartbeat_loop(); });
    try {
      std::size_t k = 0;
      while (store_->exists(key("join/" + std::to_string(k)))) ++k;
      while (!store_->create(key("join/" + std::to_string(k)), text(std::to_string(id_)))) ++k;
      std::uint64_t start = 0;
      if (auto l = store_->try_get(key("latest")))
        start = static_cast<std::uint64_t>(number(key("latest"), std::string(l->begin(), l->end()))) + 1;
      form(start);
    } catch (...) {
      stop_heartbeat();
      throw;
    }
  }
  /// Stops the heartbeat and closes the transport. The others see this
  /// process as failed (its connections close, its heartbeat stops).
  ~elastic_group() {
    comm_.reset();
    stop_heartbeat();
  }
  elastic_group(const elastic_group&) = delete;
  elastic_group& operator=(const elastic_group&) = delete;

  /// The current generation's transport (valid until the next rebuild).
  gloo_transport& transport() { return *comm_; }
  /// The current generation's number (0, 1, ...; increases with every
  /// rebuild, possibly by more than one).
  std::uint64_t generation() const noexcept { return gen_; }
  /// This process's rank in the current generation: its id's position among
  /// the members' ids.
  int rank() const noexcept { return rank_; }
  /// Number of members of the current generation.
  int size() const noexcept { return static_cast<int>(members_.size()); }
  /// The members' ids, ascending (the rank of members()[r] is r; members()[0]
  /// is the master, the lowest live id).
  const std::vector<std::int64_t>& members() const noexcept { return members_; }
  /// This process's id.
  std::int64_t id() const noexcept { return id_; }

  /// Forms the next generation with the members that are alive and every
  /// live process waiting to join, and connects its transport. Every
  /// surviving member calls it after a collective of the current generation
  /// threw (the step in flight is discarded: its results are not used); the
  /// members are whoever takes part within announce_wait (dead members, by
  /// heartbeat, are not waited for). The current transport is closed first.
  /// @throws dpkit::timeout_error when no generation with this process forms
  ///         within timeout (e.g. fewer than min_size processes are alive,
  ///         or, with elastic_options::majority, at most half of the current
  ///         members take part: the minority side of a partition);
  ///         dpkit::error when the store cannot be used.
  void rebuild() {
    comm_.reset();
    form(gen_ + 1);
  }

  /// Announces that this member enters the collectives of step `step` of
  /// the current generation (store key prog/<id>: "<generation> <step>"),
  /// and starts this member's step deadline (elastic_options::step_deadline;
  /// without one, nothing is written). Steps are numbered by the caller,
  /// equal on every member (elastic training: the applied steps).
  /// @throws dpkit::error when the store cannot be used.
  void enter_step(std::uint64_t step) {
    if (o_.step_deadline.count() <= 0) return;
    store_->put(key("prog/" + std::to_string(id_)), text(std::to_string(gen_) + " " + std::to_string(step)));
    const std::lock_guard lk(alive_mu_);
    entered_ = {gen_, step};
    entered_at_ = clock::now();
    in_step_ = true;
  }

  /// Ids of live processes that asked to join and are not members yet, as
  /// this process sees them (not a collective): in the join queue, alive,
  /// and waiting for the next generation (they announced themselves for
  /// it). A dead process in the queue, or a member expelled past its step
  /// deadline that has not woken up, is no joiner: admitting it would
  /// re-form the group at every step while its heartbeat looks alive.
  std::vector<std::int64_t> joiners() {
    scan_queue();
    std::vector<std::int64_t> out;
    for (auto q : queue_)
      if (!std::binary_search(members_.begin(), members_.end(), q) && alive(q) &&
          store_->exists(gkey(gen_ + 1, "alive/" + std::to_string(q))))
        out.push_back(q);
    return out;
  }

  /// A collective call of every member, at a step boundary: when any member
  /// sees a live process waiting to join, every member rebuilds (admitting
  /// it) and true is returned; otherwise false and nothing changes.
  /// @throws as allreduce_ring on the current transport (then rebuild());
  ///         as rebuild().
  bool admit_joiners() {
    std::uint8_t flag = joiners().empty() ? 0 : 1;
    collective_options co;
    co.timeout = o_.connect_timeout;
    allreduce_ring(*comm_, std::span<std::uint8_t>(&flag, 1), reduce_op::max, co);
    if (!flag) return false;
    rebuild();
    return true;
  }

private:
  static std::vector<char> text(const std::string& s) { return {s.begin(), s.end()}; }
  // A decimal number the store holds under `k` (a key of this protocol).
  long long number(const std::string& k, const std::string& s) const {
    std::size_t end = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &end);
    } catch (const std::exception&) {
      end = 0;
    }
    if (end == 0 || end != s.size())
      throw format_error(store_->where() + ": key '" + k + "' holds '" + s +
                         "', not a number (a damaged store, or keys of something else under its prefix)");
    return v;
  }
  std::string key(const std::string& k) const { return prefix_ + k; }
  std::string gkey(std::uint64_t t, const std::string& k) const { return key("g/" + std::to_string(t) + "/" + k); }

  void beat() { store_->put(key("hb/" + std::to_string(id_)), text(std::to_string(beats_++))); }
  void heartbeat_loop() {
    std::unique_lock lk(hb_mu_);
    while (!stop_) {
      hb_cv_.wait_for(lk, o_.heartbeat_interval, [&] { return stop_; });
      if (stop_) break;
      lk.unlock();
      try {
        beat();
      } catch (const std::exception&) {
        // the store is unreachable: the others will see this process as
        // dead, which is what it is to them
      }
      lk.lock();
    }
  }
  void stop_heartbeat() {
    {
      std::lock_guard lk(hb_mu_);
      stop_ = true;
    }
    hb_cv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  // Whether process q's heartbeat changed within dead_after, as this
  // process has watched it (first sight counts as a change).
  bool alive(std::int64_t q) {
    if (q == id_) return true;
    const std::lock_guard lk(alive_mu_); // also called by the transport's waits (any thread)
    const auto now = clock::now();
    auto v = store_->try_get(key("hb/" + std::to_string(q)));
    std::string s = v ? std::string(v->begin(), v->end()) : std::string("none");
    auto it = seen_.find(q);
    if (it == seen_.end() || it->second.first != s) {
      seen_[q] = {s, now};
      return true;
    }
    return now - it->second.second < o_.dead_after;
  }
  // Whether process q has not entered the step this process entered
  // step_deadline ago (enter_step; only while this process is in a step of
  // the current generation: the deadline counts from its own entry).
  bool lagging(std::int64_t q) {
    if (q == id_ || o_.step_deadline.count() <= 0) return false;
    const std::lock_guard lk(alive_mu_); // also called by the transport's waits (any thread)
    if (!in_step_ || clock::now() - entered_at_ < o_.step_deadline) return false;
    const auto mine = entered_;
    const std::string k = key("prog/" + std::to_string(q));
    auto v = store_->try_get(k);
    if (!v) return true; // never entered a step: behind by definition
    const std::string str(v->begin(), v->end());
    const auto sp = str.find(' ');
    if (sp == std::string::npos)
      throw format_error(store_->where() + ": key '" + k + "' holds '" + str +
                         "', not '<generation> <step>' (a damaged store, or keys of something else under its prefix)");
    const auto theirs = std::make_pair(static_cast<std::uint64_t>(number(k, str.substr(0, sp))),
                                       static_cast<std::uint64_t>(number(k, str.substr(sp + 1))));
    return theirs < mine;
  }
  // Reads the join queue's new entries.
  void scan_queue() {
    for (;;) {
      auto v = store_->try_get(key("join/" + std::to_string(queue_seen_)));
      if (!v) return;
      queue_.push_back(number(key("join/" + std::to_string(queue_seen_)), std::string(v->begin(), v->end())));
      ++queue_seen_;
    }
  }
  static std::string join_ids(const std::vector<std::int64_t>& ids) {
    std::string s;
    for (auto q : ids) {
      if (!s.empty()) s += ',';
      s += std::to_string(q);
    }
    return s;
  }
  std::vector<std::int64_t> parse_ids(const std::string& k, const std::vector<char>& v) const {
    std::vector<std::int64_t> ids;
    std::string cur;
    for (char c : v) {
      if (c == ',') {
        ids.push_back(number(k, cur));
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) ids.push_back(number(k, cur));
    return ids;
  }

  // Forms generation t (or, when it forms without this process or its
  // transport cannot connect, t + 1, ...) and connects it.
  void form(std::uint64_t t) {
    const auto due = clock::now() + o_.timeout;
    const std::string who = "elastic_group: id " + std::to_string(id_);
    for (;; ++t) {
      // The generation before: its members are the candidates this one
      // waits for (a new process reads them from the store).
      std::vector<std::int64_t> prev = members_;
      if (t > 0 && (prev.empty() || gen_ + 1 != t))
        if (auto m = store_->try_get(gkey(t - 1, "members"))) prev = parse_ids(gkey(t - 1, "members"), *m);
      store_->create(gkey(t, "alive/" + std::to_string(id_)), {});
      std::vector<std::int64_t> sorted_prev = prev;
      std::sort(sorted_prev.begin(), sorted_prev.end());
      const auto start = clock::now();
      std::vector<std::int64_t> decided;
      for (;;) {
        if (auto m = store_->try_get(gkey(t, "members"))) {
          decided = parse_ids(gkey(t, "members"), *m);
          break;
        }
        scan_queue();
        std::set<std::int64_t> candidates(prev.begin(), prev.end());
        candidates.insert(queue_.begin(), queue_.end());
        std::vector<std::int64_t> announced; // ascending (a std::set)
        bool waiting = false;
        for (auto q : candidates) {
          const bool live = alive(q);
          if (store_->exists(gkey(t, "alive/" + std::to_string(q)))) {
            if (live) announced.push_back(q);
          } else if (live && !lagging(q)) { // a member past its step deadline is not waited for
            waiting = true;
          }
        }
        const int need = t == 0 ? std::max(o_.min_size, o_.first_size) : o_.min_size;
        // the quorum: a strict majority of the generation before
        std::size_t from_prev = 0;
        for (auto q : announced) from_prev += std::binary_search(sorted_prev.begin(), sorted_prev.end(), q) ? 1 : 0;
        const std::size_t quorum = t > 0 && o_.majority && !sorted_prev.empty() ? sorted_prev.size() / 2 + 1 : 0;
        const bool enough = static_cast<int>(announced.size()) >= need && from_prev >= quorum;
        if (enough && (!waiting || clock::now() - start >= o_.announce_wait)) {
          store_->create(gkey(t, "members"), text(join_ids(announced))); // the first proposal wins
          continue;                                                       // read the winner
        }
        if (clock::now() >= due) {
          if (from_prev < quorum)
            throw timeout_error(who + ": generation " + std::to_string(t) + " did not form within " +
                                std::to_string(o_.timeout.count()) + " ms: " + std::to_string(from_prev) + " of the " +
                                std::to_string(sorted_prev.size()) + " members of generation " + std::to_string(t - 1) +
                                " take part, a majority (" + std::to_string(quorum) +
                                ") is needed; this side of a network partition (or what is left after losing half "
                                "the group) does not train, so that two sides never train apart");
          throw timeout_error(who + ": generation " + std::to_string(t) + " did not form within " +
                              std::to_string(o_.timeout.count()) + " ms (" + std::to_string(announced.size()) +
                              " live processes take part, " + std::to_string(need) + " needed)");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      const auto it = std::find(decided.begin(), decided.end(), id_);
      if (it == decided.end()) continue; // formed without this process: the next one
      gloo_options go = o_.transport;
      go.prefix.clear();
      go.timeout = o_.connect_timeout;
      const int rank = static_cast<int>(it - decided.begin());
      try {
        comm_ = std::make_unique<gloo_transport>(store_, gkey(t, "rdv"), rank, static_cast<int>(decided.size()), go);
      } catch (const invalid_argument&) {
        throw;
      } catch (const error&) {
        comm_.reset(); // a chosen member did not arrive or died: the next generation
        if (clock::now() >= due)
          throw timeout_error(who + ": no generation connected within " + std::to_string(o_.timeout.count()) +
                              " ms (the last, " + std::to_string(t) + ", failed)");
        continue;
      }
      // A member that dies while a survivor's only pending operation is a
      // send to it: the heartbeats end that wait (after dead_after).
      // With a step deadline, so does a member that has not entered the
      // step a waiting member entered step_deadline ago (enter_step).
      const auto after = o_.step_deadline.count() > 0 ? std::min(o_.dead_after, o_.step_deadline) : o_.dead_after;
      comm_->set_peer_check(
          [this, ids = decided](int r) {
            const std::int64_t q = ids[static_cast<std::size_t>(r)];
            return alive(q) && !lagging(q);
          },
          after, o_.heartbeat_interval);
      {
        const std::lock_guard lk(alive_mu_);
        in_step_ = false; // the deadline counts from the next enter_step of this generation
      }
      gen_ = t;
      rank_ = rank;
      members_ = std::move(decided);
      store_->put(key("latest"), text(std::to_string(t)));
      return;
    }
  }

  std::int64_t id_;
  elastic_options o_;
  std::shared_ptr<detail::kv_store> store_;
  std::string prefix_;
  std::uint64_t gen_ = 0;
  int rank_ = -1;
  std::vector<std::int64_t> members_;
  std::unique_ptr<gloo_transport> comm_;
  std::vector<std::int64_t> queue_; // the join queue's ids, in order
  std::size_t queue_seen_ = 0;
  std::map<std::int64_t, std::pair<std::string, clock::time_point>> seen_; // heartbeat value, when it changed
  std::uint64_t beats_ = 0;
  std::mutex alive_mu_; // seen_, entered_, entered_at_, in_step_
  std::pair<std::uint64_t, std::uint64_t> entered_{0, 0}; // (generation, step) of the last enter_step
  clock::time_point entered_at_{};
  bool in_step_ = false;
  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool stop_ = false;
  std::thread heartbeat_;
};

} // namespace dpkit
