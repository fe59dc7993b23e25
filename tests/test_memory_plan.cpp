// The memory plan (backend/memory_plan.h, `clawmine plan`) on the shipped V4-Flash and V4-Pro
// configs: each GPU's share of the routed experts shrinks with the GPU count while the replicated
// part stays; V4-Flash does not fit one 140 GiB GPU and names the fewest that fit; the sequences
// that fit are the budget left over the per-sequence state; bad input is an error naming it.
#include <gtest/gtest.h>

#include "backend/memory_plan.h"
#include "backend/step_plan.h"
#include "cli_run.h"
#include "common/error.h"
#include "model/config.h"

using namespace cm;

namespace {

const std::string kModels = std::string(CLAWMINE_TEST_DATA) + "/../../models";

TEST(MemoryPlan, FlashOverGpus) {
  const Config c = config_load(kModels + "/v4-flash");
  PlanInput in;
  in.contexts = {4096, 65536};
  in.gpus = 1;
  const MemoryPlan one = plan_memory(c, in);
  EXPECT_EQ(one.experts_per_gpu, c.n_routed_experts);
  EXPECT_GT(one.weights_per_gpu, size_t(140) << 30);  // ~150 GiB of NVFP4 experts alone
  EXPECT_EQ(one.rows[0].max_seqs, 0);
  EXPECT_GE(one.min_gpus, 2);
  EXPECT_NE(plan_text(c, in, one).find("does not fit"), std::string::npos);
  in.gpus = 4;
  const MemoryPlan four = plan_memory(c, in);
  EXPECT_EQ(four.experts_per_gpu, c.n_routed_experts / 4);
  EXPECT_EQ(four.replicated, one.replicated);
  EXPECT_NEAR(double(four.routed_per_gpu) * 4, double(one.routed_per_gpu), double(one.routed_per_gpu) * 1e-9);
  ASSERT_EQ(four.rows.size(), 2u);
  for (const PlanRow& r : four.rows) {
    EXPECT_EQ(r.state_per_slot, make_state_layout(c, 1, r.ctx, 2).bytes_per_slot);
    const size_t left = four.budget - four.weights_per_gpu - four.working;
    EXPECT_EQ(r.max_seqs, int64_t(left / r.state_per_slot)) << r.ctx;
    EXPECT_GT(r.max_seqs, 0);
  }
  EXPECT_GT(four.rows[0].max_seqs, four.rows[1].max_seqs);
  const std::string t = plan_text(c, in, four);
  EXPECT_NE(t.find("routed experts 64 of 256"), std::string::npos) << t;
  EXPECT_LE(four.min_gpus, 4);
}

TEST(MemoryPlan, ProNeedsMoreGpusThanFlash) {
  const Config flash = config_load(kModels + "/v4-flash"), pro = config_load(kModels + "/v4-pro");
  PlanInput in;
  in.gpus = 8;
  const MemoryPlan pf = plan_memory(flash, in), pp = plan_memory(pro, in);
  EXPECT_GT(pp.min_gpus, pf.min_gpus);
  EXPECT_GT(pp.weights_per_gpu, pf.weights_per_gpu);
}

TEST(MemoryPlan, BadInputIsNamed) {
  const Config c = config_load(kModels + "/v4-flash");
  PlanInput in;
  in.gpus = 0;
  EXPECT_THROW(plan_memory(c, in), Error);
  in.gpus = 2;
  in.utilization = 1.5;
  EXPECT_THROW(plan_memory(c, in), Error);
  in.utilization = 0.9;
  in.contexts = {c.max_position_embeddings + 1};
  try {
    plan_memory(c, in);
    ADD_FAILURE() << "an over-long context was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings"), std::string::npos) << e.what();
  }
}

TEST(MemoryPlan, TheCommand) {
  cm::test::RunResult r =
      cm::test::run_program({CLAWMINE_BINARY, "plan", "-m", kModels + "/v4-flash", "--gpus", "4", "--ctx", "8192"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("max sequences"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("8192"), std::string::npos) << r.out;
  cm::test::RunResult bad = cm::test::run_program({CLAWMINE_BINARY, "plan", "-m", kModels + "/v4-flash", "--gpus", "0"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("--gpus 0"), std::string::npos) << bad.err;
}

}  // namespace
