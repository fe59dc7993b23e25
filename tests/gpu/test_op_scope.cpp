// cuda::OpScope (core/op_timer.h): the launches of a scope's life are one named op of the timer attached
// to the Context; the event is recorded when the scope ends, so nested scopes split the time (the inner
// op ends first, the outer one gets what follows it), and without a timer or outside OPS mode a scope
// records nothing.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/core/op_timer.h"
#include "backend/cuda/step/step_kernels.h"
#include "gpu_test_util.h"

namespace cm {
namespace {

// A few launches on ctx's stream (scaling a buffer by 1, so any number of them leave it as it was).
void launch(cuda::Context& ctx, cuda::DeviceBuffer& buf, int times) {
  for (int i = 0; i < times; ++i) cuda::scale_f32(ctx, buf.as<float>(), int64_t(buf.size() / 4), 1.0f);
}

std::vector<std::string> labels(const std::vector<cuda::OpTimer::OpTime>& t) {
  std::vector<std::string> out;
  for (const auto& o : t) out.push_back(o.label);
  return out;
}

TEST(GpuOpScope, GroupsLaunchesIntoNamedOps) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  cuda::OpTimer timer(16);
  timer.set_mode(cuda::OpTimer::Mode::OPS);
  ctx.set_timer(&timer);
  cuda::DeviceBuffer buf(size_t(1) << 20);
  buf.zero();
  timer.begin(ctx.stream());
  {
    cuda::OpScope outer(ctx, "outer");
    {
      cuda::OpScope inner(ctx, "inner");
      launch(ctx, buf, 3);
    }
    launch(ctx, buf, 2);
  }
  {
    cuda::OpScope again(ctx, "inner");
    launch(ctx, buf, 1);
  }
  timer.end(ctx.stream());
  ctx.sync();
  const std::vector<cuda::OpTimer::OpTime> t = timer.totals();
  // In first-seen order; "end" is the interval from the last op to the step's end.
  EXPECT_EQ(labels(t), (std::vector<std::string>{"inner", "outer", "end"}));
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].calls, 2);
  EXPECT_EQ(t[1].calls, 1);
  for (const auto& o : t) EXPECT_GE(o.ms, 0.0);
  EXPECT_NEAR(t[0].ms + t[1].ms + t[2].ms, timer.span_ms(), 1e-3);
}

TEST(GpuOpScope, RecordsNothingWithoutATimerOrOutsideOpsMode) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx;
  cuda::DeviceBuffer buf(size_t(1) << 16);
  buf.zero();
  {
    cuda::OpScope op(ctx, "no timer");  // no timer attached: a no-op
    launch(ctx, buf, 1);
  }
  cuda::OpTimer timer(4);
  ctx.set_timer(&timer);
  for (const cuda::OpTimer::Mode mode : {cuda::OpTimer::Mode::OFF, cuda::OpTimer::Mode::SPAN}) {
    timer.set_mode(mode);
    timer.begin(ctx.stream());
    for (int i = 0; i < 8; ++i) {  // more scopes than the timer has room for: none is recorded
      cuda::OpScope op(ctx, "op");
      launch(ctx, buf, 1);
    }
    timer.end(ctx.stream());
    ctx.sync();
    if (mode == cuda::OpTimer::Mode::SPAN) {
      EXPECT_EQ(labels(timer.totals()), (std::vector<std::string>{"end"}));
      EXPECT_GE(timer.span_ms(), 0.0);
    }
  }
  ctx.set_timer(nullptr);
}

}  // namespace
}  // namespace cm
