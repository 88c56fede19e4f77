// dpkit benchmarks: the shared harness of the nccl-tests-style *_perf programs.
// bench_options (flags), bench_collectives (algorithms and the call),
// bench_buffers (buffers, -R rotation), bench_data (inputs and the -c check),
// bench_report (everything printed or written), bench_runner (selection,
// timing, bench_main). See docs/benchmarks.md.
#pragma once

#include "bench_buffers.hpp"
#include "bench_collectives.hpp"
#include "bench_data.hpp"
#include "bench_options.hpp"
#include "bench_report.hpp"
#include "bench_runner.hpp"
