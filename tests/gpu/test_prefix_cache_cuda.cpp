// Prefix caching across requests on the CUDA backend (tests/prefix_cache_suite.h): a request that starts
// from a snapshot gets the bits it gets from an empty slot, as on the CPU.
#include "gpu_test_util.h"
#include "../prefix_cache_suite.h"

TEST(PrefixCacheCuda, SharedSystemPrompt) {
  CM_SKIP_WITHOUT_GPU();
  prefix_cache_suite::shares_a_system_prompt(cm::Device::CUDA);
}
TEST(PrefixCacheCuda, OffReusesNothing) {
  CM_SKIP_WITHOUT_GPU();
  prefix_cache_suite::off_reuses_nothing(cm::Device::CUDA);
}
TEST(PrefixCacheCuda, SharedInFlight) {
  CM_SKIP_WITHOUT_GPU();
  prefix_cache_suite::shares_in_flight(cm::Device::CUDA, true);
  prefix_cache_suite::shares_in_flight(cm::Device::CUDA, false);
}
