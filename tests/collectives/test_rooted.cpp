// Tree broadcast and tree reduce from several roots (incl. non-zero), and the
// dissemination barrier.
#include "common.hpp"

#include <atomic>
#include <chrono>
#include <thread>

using namespace dpt;

namespace {
std::vector<int> roots_for(int n) {
  std::set<int> s{0, n - 1, n / 2, n > 1 ? 1 : 0};
  return {s.begin(), s.end()};
}
} // namespace

TEST_CASE_TEMPLATE("broadcast_tree: root's buffer on every rank, several roots", T, DPKIT_ELEMENT_TYPES) {
  for (int n : test_sizes::worlds(world_sizes)) {
    std::vector<config> cfgs;
    for (int root : roots_for(n))
      for (std::size_t count : counts_for(n))
        for (bool in_place : {false, true}) cfgs.push_back({kind::broadcast, count, reduce_op::min, in_place, {}, root});
    CAPTURE(n);
    CHECK(run_and_check<T>(n, cfgs) == 0);
  }
}

TEST_CASE_TEMPLATE("reduce_tree: op over all ranks lands on root only, several roots", T, DPKIT_ELEMENT_TYPES) {
  for (int n : test_sizes::worlds(world_sizes)) {
    std::vector<config> cfgs;
    for (int root : roots_for(n))
      for (std::size_t count : counts_for(n, root == 0))
        for (reduce_op op : all_ops) cfgs.push_back({kind::reduce, count, op, false, {}, root});
    CAPTURE(n);
    CHECK(run_and_check<T>(n, cfgs) == 0);
  }
}

TEST_CASE("barrier: no rank leaves before every rank entered") {
  for (int n : test_sizes::worlds(world_sizes)) {
    CAPTURE(n);
    constexpr int rounds = 20;
    std::vector<std::atomic<int>> arrived(rounds);
    std::atomic<int> violations{0};
    dpkit::inproc_world world(n);
    world.run([&](dpkit::inproc& comm) {
      for (int k = 0; k < rounds; ++k) {
        // Stagger arrival so a broken barrier lets early ranks through.
        if ((comm.rank() + k) % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
        arrived[static_cast<std::size_t>(k)].fetch_add(1);
        dpkit::barrier(comm);
        if (arrived[static_cast<std::size_t>(k)].load() != n) violations.fetch_add(1);
      }
    });
    CHECK(violations.load() == 0);
  }
}
