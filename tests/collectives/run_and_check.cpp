// The one translation unit that compiles dpt::run_and_check<T> for every
// element type the typed collective tests run (common.hpp declares them
// extern everywhere else).
#define DPT_RUN_AND_CHECK_INSTANTIATE
#include "common.hpp"

namespace dpt {
#define DPT_RUN_AND_CHECK_INSTANCE(T) template int run_and_check<T>(int, const std::vector<config>&, std::size_t);
DPT_FOR_EACH_ELEMENT_TYPE(DPT_RUN_AND_CHECK_INSTANCE)
#undef DPT_RUN_AND_CHECK_INSTANCE
} // namespace dpt
