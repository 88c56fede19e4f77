/// @file data.hpp
/// @brief Umbrella header of dpkit's data area (docs/design.md "Data"; docs/data.md): memory-mapped
/// files, JSONL line indices and datasets, permutation engines, the
/// distributed sampler and the token-budget batch sampler. The simdjson-based
/// length column is separate: dpkit/data/jsonl_length_column.hpp.
#pragma once

#include <dpkit/data/distributed_sampler.hpp>
#include <dpkit/data/jsonl_index.hpp>
#include <dpkit/data/mapped_file.hpp>
#include <dpkit/data/permutation.hpp>
#include <dpkit/data/token_budget_sampler.hpp>
