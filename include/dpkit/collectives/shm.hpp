/// @file shm.hpp
/// @brief Every shared-memory collective on one node (the shm refinement,
/// shared_memory_transport): their home is collectives/shm/, one file per
/// algorithm as Gloo keeps them (entry point and body together), with
/// steps.hpp holding the step protocol they share:
/// - shm/allreduce.hpp: allreduce_shm (one-shot or two-shot by size),
///   allreduce_shm_one_shot, allreduce_shm_two_shot;
/// - shm/broadcast.hpp, shm/reduce.hpp, shm/allgather.hpp,
///   shm/reduce_scatter.hpp: broadcast_shm, reduce_shm, allgather_shm,
///   reduce_scatter_shm.
/// The segment itself belongs to the transports
/// (transport/detail/shm_segment.hpp). The dispatchers (allreduce,
/// broadcast, ...) reach these with algorithm::shm and pick them
/// automatically on one node.
#pragma once

#include "shm/allgather.hpp"
#include "shm/allreduce.hpp"
#include "shm/broadcast.hpp"
#include "shm/reduce.hpp"
#include "shm/reduce_scatter.hpp"
