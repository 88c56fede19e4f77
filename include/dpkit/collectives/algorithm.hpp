/// @file algorithm.hpp
/// @brief The `algorithm` enum (defined in core/algorithm.hpp, where the
/// tuning table that transports read can name it); included here so that
/// collectives code finds it beside the algorithms.
#pragma once

#include "../core/algorithm.hpp"
