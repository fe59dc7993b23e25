// The step's small ops of the op table: see add_basic_cases.
#include "bench/optable/op_case.h"

namespace cm::optable {

void add_basic_cases(std::vector<OpCase>&) {}

}  // namespace cm::optable
