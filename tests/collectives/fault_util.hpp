// Shared by the unhappy-path tests on inproc (test_faults.cpp, test_shm.cpp):
// runs a body on every rank of a world and records how each rank's call
// ended (which dpkit error, its message, after how many seconds).
#pragma once

#include <dpkit/dpkit.hpp>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace faults {

inline double since(dpkit::clock::time_point t0) {
  return std::chrono::duration<double>(dpkit::clock::now() - t0).count();
}

struct outcome {
  std::string type = "none"; // ok, mismatch, peer, timeout, communicator, invalid, other
  std::string what;
  double seconds = 0;
};

/// Runs body(comm) on every rank of `world`. With `rethrow`, a rank whose call
/// failed rethrows (its function fails the world, as a user's would).
inline std::vector<outcome> run_world(dpkit::inproc_world& world, const std::function<void(dpkit::inproc&)>& body,
                                      bool rethrow) {
  std::vector<outcome> out(static_cast<std::size_t>(world.size()));
  try {
    world.run([&](dpkit::inproc& comm) {
      auto& oc = out[static_cast<std::size_t>(comm.rank())];
      const auto t0 = dpkit::clock::now();
      try {
        body(comm);
        oc.type = "ok";
      } catch (const dpkit::mismatch_error& e) {
        oc = {"mismatch", e.what(), since(t0)};
      } catch (const dpkit::peer_error& e) {
        oc = {"peer", e.what(), since(t0)};
      } catch (const dpkit::timeout_error& e) {
        oc = {"timeout", e.what(), since(t0)};
      } catch (const dpkit::communicator_error& e) {
        oc = {"communicator", e.what(), since(t0)};
      } catch (const dpkit::invalid_argument& e) {
        oc = {"invalid", e.what(), since(t0)};
      } catch (const std::exception& e) {
        oc = {"other", e.what(), since(t0)};
      }
      if (rethrow && oc.type != "ok") throw std::runtime_error(oc.what);
    });
  } catch (...) {
  }
  return out;
}

} // namespace faults
