// The grouped MoE of the op table (moe_nvfp4): see add_moe_cases.
#include "bench/optable/op_case.h"

namespace cm::optable {

void add_moe_cases(std::vector<OpCase>&) {}

}  // namespace cm::optable
