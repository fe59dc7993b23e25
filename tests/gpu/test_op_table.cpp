// The GPU op table (bench/optable, docs/gpu-ops.md) as one value-parameterized
// test: Table/GpuOp.Check/<case name>. Each case makes fresh random inputs
// from its seed (CLAWMINE_OPTABLE_SEED, default 1, mixed with the case name),
// runs the op into guarded outputs and compares with the CPU oracle within the
// case's stated tolerance; bit-exactness contracts are exact comparisons.
// Cases marked huge are sampled: one in four (by name and seed) runs unless
// CLAWMINE_OPTABLE_HUGE=1 runs them all. Device cases skip without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "backend/cuda/core/cuda_util.h"
#include "bench/optable/op_case.h"
#include "gpu_test_util.h"

namespace cm {
namespace {

using optable::OpCase;

uint64_t base_seed() {
  const char* s = std::getenv("CLAWMINE_OPTABLE_SEED");
  return s && *s ? std::strtoull(s, nullptr, 10) : 1;
}

uint64_t case_seed(const OpCase& c) { return base_seed() * 1000003ULL + std::hash<std::string>{}(c.name) % 1000003ULL; }

class GpuOp : public testing::TestWithParam<size_t> {};

TEST_P(GpuOp, Check) {
  const OpCase& c = optable::all_cases()[GetParam()];
  RecordProperty("family", c.family);
  optable::Checker k;
  if (c.host_check) {
    c.host_check(k);
  } else {
    CM_SKIP_WITHOUT_GPU();
    if (c.huge) {
      const char* all = std::getenv("CLAWMINE_OPTABLE_HUGE");
      if (!(all && std::string(all) == "1") && case_seed(c) % 4 != 0)
        GTEST_SKIP() << "huge case, not in this seed's sample (CLAWMINE_OPTABLE_HUGE=1 runs every one)";
    }
    // one Context for the whole table (its setup costs more than most cases), never destroyed: no
    // teardown after the CUDA runtime's at exit
    static cuda::Context& ctx = *new cuda::Context;
    optable::MakeOptions o;
    o.seed = case_seed(c);
    std::unique_ptr<optable::OpRun> run = c.make(ctx, o);
    run->check(ctx, k);
    ctx.sync();
  }
  for (const std::string& l : k.lines()) std::printf("[ error ] %s %s\n", c.name.c_str(), l.c_str());
  for (const std::string& f : k.failures()) ADD_FAILURE() << c.name << " (" << optable::shape_text(c) << "): " << f;
}

INSTANTIATE_TEST_SUITE_P(Table, GpuOp, testing::Range<size_t>(0, optable::all_cases().size()),
                         [](const testing::TestParamInfo<size_t>& i) { return optable::all_cases()[i.param].name; });

}  // namespace
}  // namespace cm
