/// @file collectives.hpp
/// @brief Umbrella header of dpkit's collectives: every algorithm (ring and
/// tree), the dispatchers that choose one (allreduce, reduce_scatter,
/// allgather, broadcast, reduce, barrier) and their `*_async` variants;
/// gather, scatter, alltoall and alltoallv.
/// docs/algorithms.md describes the algorithms and when each wins.
#pragma once

#include "collectives/allgather.hpp"
#include "collectives/allreduce.hpp"
#include "collectives/alltoall.hpp"
#include "collectives/async.hpp"
#include "collectives/barrier.hpp"
#include "collectives/broadcast.hpp"
#include "collectives/cost_model.hpp"
#include "collectives/gather.hpp"
#include "collectives/reduce.hpp"
#include "collectives/reduce_scatter.hpp"
#include "collectives/scatter.hpp"
#include "collectives/shm.hpp"
#include "collectives/symmetric_memory.hpp"
#include "collectives/tuning.hpp"
