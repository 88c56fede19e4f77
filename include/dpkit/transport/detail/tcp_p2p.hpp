// dpkit internals: point-to-point messages between ranks on different nodes
// over TCP connections of dpkit's own, for transports whose ranks meet
// through a store (gloo_transport): the role Open MPI's tcp BTL plays for
// dpkit::mpi. Not for users.
//
// Why not Gloo's pairs. Gloo's unbound-buffer messages (what a transport
// with MPI's matching needs) are receiver-driven: the sender announces the
// message, the receiver answers when its receive is posted, then the bytes
// go, and each step is handled by Gloo's event-loop thread and handed to the
// waiting thread. On the emulated 2x2 cluster a cross-node message of 8 B to
// 32 KiB took 150-2600 us that way against Open MPI's 37-134 us
// (benchmarks/results/2026-11-26-store-launch-shared-memory.md). Here a
// message leaves at once (eager: a 16-byte header, then the payload, on the
// connection to its receiver) and the waiting thread itself reads and
// writes the sockets (non-blocking; it sleeps in ppoll when nothing moves).
//
// Matching. A message is received by the oldest posted receive of its
// sender with its tag (MPI's non-overtaking rule, as shm_p2p.hpp); one that
// arrives before its receive is read into a buffer of its own (MPI's
// unexpected queue), up to a budget of tcp_p2p_early_budget bytes per peer:
// past it the next message stays in the kernel until its receive is posted
// (TCP's flow control then stops the sender). A receive posted for a
// message being read takes the bytes read so far and the rest goes straight
// into its buffer: a message whose receive is posted first is read once,
// from the socket into the user's buffer.
//
// Failure. A connection that closes (the peer exited, crashed or closed its
// transport) or breaks fails the operations pending with that peer
// (p2p_op::peer_lost): what the peer sent before is still received. Bytes
// that are not a dpkit header where one is due (another program connected,
// a damaged stream) fail that peer's operations too, naming the bytes.
#pragma once

#include "health.hpp"
#include "p2p_engine.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dpkit::detail {

/// The header in front of every message on a dpkit TCP connection.
struct tcp_p2p_header {
  std::uint32_t magic;  // tcp_p2p_magic
  std::int32_t tag;
  std::uint64_t bytes;  // payload bytes that follow
};
static_assert(sizeof(tcp_p2p_header) == 16);
inline constexpr std::uint32_t tcp_p2p_magic = 0x64704d31u; // "dpM1"

/// Bytes of unexpected messages (arrived before their receive) a rank
/// buffers per peer before it stops reading that peer's connection.
inline constexpr std::size_t tcp_p2p_early_budget = std::size_t{4} << 20;

/// The TCP point-to-point engine of one rank (see the file comment): one
/// connected stream socket per peer. Thread-safe: one mutex guards its
/// queues (a rank's user thread and its communication thread may both wait).
class tcp_p2p final : public p2p_engine {
public:
  /// Rank `rank` of `size`, `fds[p]` a connected stream socket to rank p
  /// (-1 for this rank; the engine owns and closes them; made non-blocking
  /// here).
  tcp_p2p(int rank, int size, std::vector<int> fds)
      : rank_(rank), size_(size), fds_(std::move(fds)), out_(static_cast<std::size_t>(size)),
        in_(static_cast<std::size_t>(size)), broken_(static_cast<std::size_t>(size)),
        out_broken_(static_cast<std::size_t>(size)) {
    for (int p = 0; p < size_; ++p) {
      const int fd = fds_[static_cast<std::size_t>(p)];
      if (p == rank_ || fd < 0) continue;
      set_nonblocking(fd);
      const int one = 1;
      (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
  }
  tcp_p2p(const tcp_p2p&) = delete;
  tcp_p2p& operator=(const tcp_p2p&) = delete;
  ~tcp_p2p() override {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The socket connected to rank `peer` (-1 for this rank), for
  /// inspection (TCP_INFO, TCP_CONGESTION); the engine owns it.
  /// Precondition: 0 <= peer < size().
  int socket_of(int peer) const noexcept { return fds_[static_cast<std::size_t>(peer)]; }
  const char* medium() const noexcept override { return "TCP"; }
  /// A poll here is a system call per peer (about 1 us), not a load from
  /// shared memory: a wait polls a few times, yields a few times, then
  /// sleeps in ppoll, which the arriving bytes end. 256 polling system calls
  /// kept a peer that shares the core from running: on the emulated
  /// cluster, two ranks bound to one core took 300 us per 8-byte ring
  /// all-reduce instead of 71 us (Open MPI's).
  int spin_polls(int shm_spins) const noexcept override { return std::min(shm_spins, 8); }
  unsigned yield_polls(unsigned shm_yields) const noexcept override { return std::min(shm_yields, 16u); }

  std::shared_ptr<p2p_op> post_send(const std::byte* data, std::size_t bytes, int peer, int tag) override {
    auto op = make(true, const_cast<std::byte*>(data), bytes, peer, tag);
    std::lock_guard lk(mu_);
    if (!lost(*op, out_broken_[static_cast<std::size_t>(peer)])) {
      out_[static_cast<std::size_t>(peer)].q.push_back(op);
      pump_out(peer);
    }
    return op;
  }

  std::shared_ptr<p2p_op> post_recv(std::byte* data, std::size_t bytes, int peer, int tag) override {
    auto op = make(false, data, bytes, peer, tag);
    std::lock_guard lk(mu_);
    incoming& s = in_[static_cast<std::size_t>(peer)];
    for (auto it = s.early.begin(); it != s.early.end(); ++it) {
      early_msg& u = **it;
      if (u.tag != tag) continue;
      const bool receiving = s.active && s.target_ux == &u;
      if (!receiving && u.got < u.bytes) { // cut off when the connection was lost
        fail_op(*op, op->describe(rank_) + ": the connection to rank " + std::to_string(peer) + " " +
                         broken_[static_cast<std::size_t>(peer)] + " in the middle of this message", true);
      } else if (u.bytes != bytes) {
        fail_op(*op, length_text(*op, u.bytes));
        if (receiving) s.target_ux = nullptr; // the rest is read and dropped
      } else {
        if (u.got) std::memcpy(op->data, u.data.get(), u.got);
        op->moved = u.got;
        if (receiving) {
          s.target_ux = nullptr;
          s.target_op = op;
        } else {
          op->state.store(p2p_op::done, std::memory_order_release);
        }
      }
      s.early_bytes -= u.bytes;
      s.early.erase(it);
      pump_in(peer); // a message held back by the budget may be read now
      return op;
    }
    if (s.held && s.hdr.tag == tag) { // the next message, held back by the budget, is this one
      s.held = false;
      begin(s, op);
      pump_in(peer);
      return op;
    }
    if (lost(*op, broken_[static_cast<std::size_t>(peer)])) return op;
    s.posted.push_back(op);
    pump_in(peer);
    return op;
  }

  bool progress() override {
    std::lock_guard lk(mu_);
    bool moved = false;
    // every peer's connection is read about every 64th call (unexpected
    // messages are drained); otherwise only those a receive waits on: a
    // read that finds nothing is a system call per peer
    const bool all = drain_.exchange(false, std::memory_order_relaxed) || (++calls_ & 63u) == 0;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const incoming& s = in_[static_cast<std::size_t>(p)];
      if (all || s.active || !s.posted.empty()) moved |= pump_in(p);
      if (!out_[static_cast<std::size_t>(p)].q.empty()) moved |= pump_out(p);
    }
    return moved;
  }

  void sleep(long us) override {
    std::vector<pollfd> fds;
    fds.reserve(static_cast<std::size_t>(size_));
    {
      std::lock_guard lk(mu_);
      for (int p = 0; p < size_; ++p) {
        const auto i = static_cast<std::size_t>(p);
        if (p == rank_ || fds_[i] < 0 || !broken_[i].empty()) continue;
        short ev = 0;
        if (!in_[i].held) ev |= POLLIN;
        if (!out_[i].q.empty() && out_broken_[i].empty()) ev |= POLLOUT;
        if (ev) fds.push_back({fds_[i], ev, 0});
      }
    }
    timespec ts{us / 1000000, (us % 1000000) * 1000};
    if (fds.empty()) {
      ::nanosleep(&ts, nullptr);
      return;
    }
    if (::ppoll(fds.data(), fds.size(), &ts, nullptr) > 0)
      for (const pollfd& f : fds)
        if (f.revents & (POLLIN | POLLHUP | POLLERR)) drain_.store(true, std::memory_order_relaxed); // progress() reads them all
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
      if (s.held && s.hdr.tag == tag) return p;
    }
    return -1;
  }

  int foreign_message(int peer, int tag) override {
    std::lock_guard lk(mu_);
    const incoming& s = in_[static_cast<std::size_t>(peer)];
    for (const auto& u : s.early)
      if (foreign_tag(tag, u->tag)) return u->tag;
    if (s.held && foreign_tag(tag, s.hdr.tag)) return s.hdr.tag;
    return 0;
  }

  bool withdraw(p2p_op& op) override {
    std::lock_guard lk(mu_);
    if (op.state.load(std::memory_order_acquire) != p2p_op::pending) return false;
    const auto p = static_cast<std::size_t>(op.peer);
    auto drop = [&](std::deque<std::shared_ptr<p2p_op>>& q) {
      q.erase(std::remove_if(q.begin(), q.end(), [&](const auto& o) { return o.get() == &op; }), q.end());
    };
    if (op.is_send) {
      outgoing& o = out_[p];
      const bool front = !o.q.empty() && o.q.front().get() == &op;
      if (front && o.sent > 0) {
        // half on the wire: the stream cannot go on (the caller fails the transport)
        broken_[p] = out_broken_[p] = "a send to it was abandoned half-way";
        ::shutdown(fds_[p], SHUT_RDWR);
      }
      drop(o.q);
      if (front) o.sent = 0;
    } else {
      drop(in_[p].posted);
      if (in_[p].active && in_[p].target_op.get() == &op) in_[p].target_op.reset(); // the rest is dropped
    }
    fail_op(op, op.describe(rank_) + " was abandoned before it completed");
    return true;
  }

  void fail_all(const std::string& why) override {
    std::lock_guard lk(mu_);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      fail_peer_ops(p, why, false);
    }
  }

  void close() override {
    std::lock_guard lk(mu_);
    for (int p = 0; p < size_; ++p) {
      const auto i = static_cast<std::size_t>(p);
      if (p == rank_ || fds_[i] < 0) continue;
      ::shutdown(fds_[i], SHUT_RDWR);
      if (broken_[i].empty()) broken_[i] = "this rank closed its connections (its transport failed)";
      if (out_broken_[i].empty()) out_broken_[i] = broken_[i];
    }
  }

private:
  struct early_msg {
    int tag = 0;
    std::size_t bytes = 0, got = 0;
    std::unique_ptr<std::byte[]> data;
  };
  struct incoming {
    std::deque<std::shared_ptr<p2p_op>> posted;   // unmatched receives, in posting order
    std::deque<std::unique_ptr<early_msg>> early; // messages read before their receive, in order
    std::size_t early_bytes = 0;
    tcp_p2p_header hdr{};
    std::size_t hdr_got = 0;     // bytes of the next header read
    bool held = false;           // hdr is complete, its payload waits for a receive (budget)
    bool active = false;         // hdr's payload is being read ...
    std::size_t got = 0;
    std::shared_ptr<p2p_op> target_op; // ... into this receive,
    early_msg* target_ux = nullptr;    // ... or this buffer; neither: read into sink_ and dropped
                                       // (its receive failed or was withdrawn)
  };
  struct outgoing {
    std::deque<std::shared_ptr<p2p_op>> q; // front: on the wire
    std::size_t sent = 0;                  // bytes of the front's header + payload written
    tcp_p2p_header hdr{};
  };

  static void set_nonblocking(int fd) noexcept {
    const int fl = ::fcntl(fd, F_GETFL, 0);
    if (fl >= 0) (void)::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  }
  static std::shared_ptr<p2p_op> make(bool is_send, std::byte* data, std::size_t bytes, int peer, int tag) {
    return make_p2p_op(is_send, data, bytes, peer, tag, "TCP");
  }
  static void fail_op(p2p_op& op, const std::string& why, bool peer_lost = false) { fail_p2p_op(op, why, peer_lost); }
  std::string length_text(const p2p_op& op, std::size_t sent) const { return p2p_length_text(op, rank_, sent); }
  // An op posted with a peer whose connection is gone (`why`: the send or
  // the receive direction's reason) fails at once. mu_ held.
  bool lost(p2p_op& op, const std::string& why) {
    if (why.empty()) return false;
    fail_op(op, op.describe(rank_) + ": the connection to rank " + std::to_string(op.peer) + " is gone (" + why + ")",
            true);
    return true;
  }
  // Fails every op pending with peer p. mu_ held.
  void fail_peer_ops(int p, const std::string& why, bool peer_lost) {
    const auto i = static_cast<std::size_t>(p);
    for (auto& op : out_[i].q) fail_op(*op, op->describe(rank_) + ": " + why, peer_lost);
    out_[i].q.clear();
    out_[i].sent = 0;
    for (auto& op : in_[i].posted) fail_op(*op, op->describe(rank_) + ": " + why, peer_lost);
    in_[i].posted.clear();
    if (in_[i].target_op) {
      fail_op(*in_[i].target_op, in_[i].target_op->describe(rank_) + ": " + why, peer_lost);
      in_[i].target_op.reset();
    }
  }
  // The connection to p closed or broke: its pending ops fail. mu_ held.
  void lose(int p, const std::string& why) {
    const auto i = static_cast<std::size_t>(p);
    if (broken_[i].empty()) broken_[i] = why;
    if (out_broken_[i].empty()) out_broken_[i] = why;
    in_[i].active = false;
    in_[i].held = false;
    fail_peer_ops(p, gone_text(p, why), true);
  }
  // "the connection to rank P WHY: rank P failed, exited or closed its transport".
  static std::string gone_text(int p, const std::string& why) {
    return "the connection to rank " + std::to_string(p) + " " + why + ": rank " + std::to_string(p) +
           " failed, exited or closed its transport";
  }

  // Writes what fits of p's queued sends. mu_ held.
  bool pump_out(int p) {
    const auto i = static_cast<std::size_t>(p);
    outgoing& o = out_[i];
    bool moved = false;
    while (!o.q.empty() && out_broken_[i].empty()) {
      p2p_op& op = *o.q.front();
      if (o.sent == 0) o.hdr = {tcp_p2p_magic, op.tag, static_cast<std::uint64_t>(op.bytes)};
      const std::size_t total = sizeof(tcp_p2p_header) + op.bytes;
      iovec iov[2];
      int n = 0;
      if (o.sent < sizeof(tcp_p2p_header))
        iov[n++] = {reinterpret_cast<char*>(&o.hdr) + o.sent, sizeof(tcp_p2p_header) - o.sent};
      const std::size_t done = o.sent > sizeof(tcp_p2p_header) ? o.sent - sizeof(tcp_p2p_header) : 0;
      if (op.bytes > done) iov[n++] = {op.data + done, op.bytes - done};
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = static_cast<std::size_t>(n);
      const ssize_t w = ::sendmsg(fds_[i], &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
        // the peer closed or broke; what it sent before is still read
        // (the receive direction fails when its end of stream is read)
        out_broken_[i] = std::string("broke (send: ") + std::strerror(errno) + ")";
        const std::string text = gone_text(p, out_broken_[i]);
        for (auto& q : o.q) fail_op(*q, q->describe(rank_) + ": " + text, true);
        o.q.clear();
        o.sent = 0;
        return true;
      }
      moved = true;
      o.sent += static_cast<std::size_t>(w);
      op.started = true;
      op.moved = o.sent > sizeof(tcp_p2p_header) ? o.sent - sizeof(tcp_p2p_header) : 0;
      if (o.sent < total) return moved;
      op.state.store(p2p_op::done, std::memory_order_release);
      o.q.pop_front();
      o.sent = 0;
    }
    return moved;
  }

  // Starts receiving the message of header s.hdr into op (or fails op on a
  // length mismatch and drops the payload). mu_ held.
  void begin(incoming& s, const std::shared_ptr<p2p_op>& op) {
    s.active = true;
    s.got = 0;
    s.target_ux = nullptr;
    if (op->bytes != s.hdr.bytes) fail_op(*op, length_text(*op, s.hdr.bytes));
    else s.target_op = op;
    finish_if_empty(s);
  }
  void finish_if_empty(incoming& s) {
    if (!s.active || s.got < s.hdr.bytes) return;
    if (s.target_op) {
      s.target_op->moved = s.got;
      s.target_op->state.store(p2p_op::done, std::memory_order_release);
      s.target_op.reset();
    }
    if (s.target_ux) s.target_ux->got = s.got;
    s.target_ux = nullptr;
    s.active = false;
    s.hdr_got = 0;
  }
  // Matches the complete header s.hdr: the oldest posted receive of its tag,
  // else an early buffer if the budget allows, else held. mu_ held.
  void match(incoming& s) {
    for (auto it = s.posted.begin(); it != s.posted.end(); ++it)
      if ((*it)->tag == s.hdr.tag) {
        auto op = std::move(*it);
        s.posted.erase(it);
        begin(s, op);
        return;
      }
    take_early(s);
  }
  void take_early(incoming& s) {
    const std::size_t n = static_cast<std::size_t>(s.hdr.bytes);
    if (!s.early.empty() && s.early_bytes + n > tcp_p2p_early_budget) {
      s.held = true;
      return;
    }
    s.held = false;
    auto u = std::make_unique<early_msg>();
    u->tag = s.hdr.tag;
    u->bytes = n;
    u->data.reset(new std::byte[n > 0 ? n : 1]);
    s.early_bytes += n;
    s.active = true;
    s.got = 0;
    s.target_ux = u.get();
    s.early.push_back(std::move(u));
    finish_if_empty(s);
  }

  // Reads what has arrived from p. mu_ held.
  bool pump_in(int p) {
    const auto i = static_cast<std::size_t>(p);
    incoming& s = in_[i];
    bool moved = false;
    for (;;) {
      if (!broken_[i].empty()) return moved;
      if (s.held) {
        take_early(s); // still held while the budget is spent
        if (s.held) return moved;
        continue;
      }
      std::byte* dst;
      std::size_t want;
      if (!s.active) {
        dst = reinterpret_cast<std::byte*>(&s.hdr) + s.hdr_got;
        want = sizeof(tcp_p2p_header) - s.hdr_got;
      } else {
        const std::size_t left = static_cast<std::size_t>(s.hdr.bytes) - s.got;
        if (s.target_op) dst = s.target_op->data + s.got;
        else if (s.target_ux) dst = s.target_ux->data.get() + s.got;
        else {
          if (!sink_) sink_.reset(new std::byte[sink_bytes]);
          dst = sink_.get();
        }
        want = s.target_op || s.target_ux ? left : std::min(left, sink_bytes);
      }
      const ssize_t r = ::recv(fds_[i], dst, want, MSG_DONTWAIT);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
        lose(p, std::string("broke (receive: ") + std::strerror(errno) + ")");
        return true;
      }
      if (r == 0) {
        lose(p, s.active || s.hdr_got ? "closed in the middle of a message" : "closed");
        return true;
      }
      moved = true;
      if (!s.active) {
        s.hdr_got += static_cast<std::size_t>(r);
        if (s.hdr_got < sizeof(tcp_p2p_header)) continue;
        if (s.hdr.magic != tcp_p2p_magic) {
          char hex[16];
          std::snprintf(hex, sizeof hex, "%08x", s.hdr.magic);
          lose(p, std::string("carried bytes that are not a dpkit message header (0x") + hex +
                      "; another program on the connection, or a damaged stream)");
          ::shutdown(fds_[i], SHUT_RDWR);
          return true;
        }
        match(s);
        continue;
      }
      s.got += static_cast<std::size_t>(r);
      if (s.target_op) s.target_op->moved = s.got;
      else if (s.target_ux) s.target_ux->got = s.got;
      finish_if_empty(s);
    }
  }

  static constexpr std::size_t sink_bytes = 64 << 10;
  int rank_, size_;
  std::vector<int> fds_;
  std::mutex mu_;
  std::vector<outgoing> out_;
  std::vector<incoming> in_;
  std::vector<std::string> broken_;     // why the connection to each peer is gone ("" while it works)
  std::vector<std::string> out_broken_; // why sends to each peer fail (a send failed; or broken_)
  std::unique_ptr<std::byte[]> sink_; // where discarded payloads are read to
  unsigned calls_ = 0;
  std::atomic<bool> drain_{false}; // sleep() saw a connection with something to read
};

} // namespace dpkit::detail
