// The CUDA Context's per-device setup and reserved workspace: kernel
// occupancies and attributes are measured when the Context is made (not in
// process-wide statics), and a linear that needs more scratch than reserved
// fails with an error naming the buffer instead of reallocating inside the
// call (a reallocation would free memory a captured CUDA graph still uses).
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/linear/linear.h"
#include "common/error.h"
#include "gpu_test_util.h"

namespace cm {
namespace {

TEST(GpuContext, SetupIsPerContext) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context a, b(0, false);
  for (int i = 0; i < 3; ++i) {
    EXPECT_GT(a.setup().nvfp4_decode_occupancy[i], 0);
    EXPECT_GT(a.setup().fp8_decode_occupancy[i], 0);
    EXPECT_EQ(a.setup().nvfp4_decode_occupancy[i], b.setup().nvfp4_decode_occupancy[i]);
  }
  const cuda::Workspace d = cuda::Context::default_workspace(a.sm_count(), a.setup());
  EXPECT_GE(a.workspace().splitk_floats, d.splitk_floats);
  EXPECT_GE(a.workspace().splitk_counters, d.splitk_counters);
}

TEST(GpuContext, TooSmallWorkspaceIsAnErrorNotAGrowth) {
  CM_SKIP_WITHOUT_GPU();
  cuda::Context ctx(0, true, size_t(1) << 20);  // 1 MiB of panel scratch
  const int64_t N = 4096, K = 4096, M = 300;
  cuda::DeviceLinear w = cuda::random_nvfp4(N, K, 5);
  cuda::DeviceBuffer x(size_t(M * K) * 2), y(size_t(M * N) * 4);
  x.zero();
  try {
    cuda::linear_nvfp4(ctx, w, x.as<uint16_t>(), M, K, y.get(), N, cuda::OutType::F32, 64,
                       cuda::PrefillKernel::DequantCublas);
    FAIL() << "a 32 MiB weight panel ran in 1 MiB of reserved scratch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("panel scratch too small"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ctx.workspace().panel_bytes, size_t(1) << 20);  // nothing grew
  cuda::Workspace more = ctx.workspace();
  more.panel_bytes = size_t(N * K) * 2;
  ctx.reserve_workspace(more);
  cuda::linear_nvfp4(ctx, w, x.as<uint16_t>(), M, K, y.get(), N, cuda::OutType::F32, 64,
                     cuda::PrefillKernel::DequantCublas);
  ctx.sync();
}

}  // namespace
}  // namespace cm
