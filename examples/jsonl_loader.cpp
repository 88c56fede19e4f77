// jsonl_loader: the data side of a DDP training loop in C++.
// Opens (building if needed) the index of a JSONL file with its num_tokens
// column, then iterates rank R's token-budget batches for two epochs.
//
//   build/examples/jsonl_loader build/data/debian-descriptions.jsonl [world_size] [rank]
#include <dpkit/data.hpp>
#if __has_include(<simdjson.h>)
#include <dpkit/data/jsonl_length_column.hpp>
#endif

#include "run_main.hpp"

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  return dpkit_programs::run_main("jsonl_loader", [&] {
    if (argc < 2) {
      std::fprintf(stderr, "usage: %s FILE.jsonl [world_size] [rank]\n", argv[0]);
      return 2;
    }
    const std::uint64_t world = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 4;
    const std::uint64_t rank = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 0;
    dpkit::jsonl_index_open_options open;
    open.rebuild_if_stale = true; // build FILE.jsonl.idx on first use
#if __has_include(<simdjson.h>)
    open.build.length_column = dpkit::json_length_column("num_tokens");
#endif
    const auto index = dpkit::jsonl_index::open(argv[1], open);
    if (!index.has_lengths()) {
      std::fprintf(stderr, "%s has no length column (build it with dpkit-jsonl index --field num_tokens)\n", argv[1]);
      return 1;
    }
    dpkit::token_budget_options o;
    o.max_tokens = 4096;
    dpkit::token_budget_batch_sampler sampler(index.lengths(), world, rank, o);
    for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
      sampler.set_epoch(epoch); // every rank builds the same plan
      std::uint64_t bytes = 0;
      for (std::uint64_t step = 0; step < sampler.num_batches(); ++step)
        for (std::uint64_t i : sampler.batch(step)) bytes += index[i].size(); // parse + tokenize here
      std::printf("epoch %llu: rank %llu/%llu ran %llu batches, %llu bytes of JSON\n", static_cast<unsigned long long>(epoch),
                  static_cast<unsigned long long>(rank), static_cast<unsigned long long>(world),
                  static_cast<unsigned long long>(sampler.num_batches()), static_cast<unsigned long long>(bytes));
    }
    return 0;
  });
}
