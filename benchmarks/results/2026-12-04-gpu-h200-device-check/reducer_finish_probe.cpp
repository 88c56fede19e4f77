// The one-rank (and two-rank) gradient_reducer finish() over GPT-2's buckets, with and
// without compute_stats and comm_thread, on the CPU (2026-12-04-gpu-h200-device-check.md, runs 2-3):
//   g++ -std=c++20 -O2 -pthread -Iinclude <this file> -o /tmp/gr && /tmp/gr 1 && /tmp/gr 2
#include <dpkit/fusion/gradient_reducer.hpp>
#include <dpkit/fusion/model_spec.hpp>
#include <dpkit/transport/inproc.hpp>
#include <chrono>
#include <cstdio>
int main(int argc, char** argv) {
  const int world = argc > 1 ? std::atoi(argv[1]) : 1;
  auto spec = dpkit::load_model_spec("data/models/gpt2-124m.tsv");
  for (int stats = 0; stats < 2; ++stats)
  for (int ct = 0; ct < 2; ++ct) {
    dpkit::inproc_world w(world);
    w.run([&](dpkit::inproc& c) {
      dpkit::reducer_options ro; ro.gradient_as_bucket_view = true; ro.compute_stats = stats; ro.comm_thread = ct;
      dpkit::gradient_reducer<dpkit::inproc> red(c, spec.param_infos(), ro, spec.names());
      for (int it = 0; it < 4; ++it) {
        auto t0 = std::chrono::steady_clock::now();
        for (std::size_t i = spec.params.size(); i-- > 0;) red.mark_ready(i);
        auto t1 = std::chrono::steady_clock::now();
        red.finish();
        auto t2 = std::chrono::steady_clock::now();
        if (c.rank() == 0 && it == 3) std::printf("world %d stats %d comm_thread %d: mark %.1f ms finish %.1f ms\n", world, stats, ct,
          std::chrono::duration<double>(t1 - t0).count() * 1e3, std::chrono::duration<double>(t2 - t1).count() * 1e3);
      }
    });
  }
}
