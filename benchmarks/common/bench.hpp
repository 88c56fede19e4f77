// dpkit benchmarks: the shared harness of the nccl-tests-style *_perf programs
// (flags, timing, data check, nccl-tests' table, CSV / JSON). See
// docs/benchmarks.md.
#pragma once

#include "bench_data.hpp"
#include "bench_device.hpp"
#include "bench_options.hpp"
#include "bench_report.hpp"
#include "bench_runner.hpp"
