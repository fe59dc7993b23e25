// The skip of the GPU tests when no CUDA device exists. (The op tests' random
// inputs, guarded outputs and metrics live with the op table: bench/optable/op_util.h.)
#pragma once
#include <gtest/gtest.h>

#include "backend/cuda/core/cuda_util.h"

namespace cm::gputest {

#define CM_SKIP_WITHOUT_GPU()                                                 \
  do {                                                                        \
    if (::cm::cuda::device_count() == 0) {                                   \
      GTEST_SKIP() << "no CUDA device";                                      \
    }                                                                        \
  } while (0)

}  // namespace cm::gputest
