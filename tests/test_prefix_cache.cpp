// Prefix caching across requests on the CPU backend (tests/prefix_cache_suite.h).
#include "prefix_cache_suite.h"

TEST(PrefixCache, SharedSystemPromptCpu) { prefix_cache_suite::shares_a_system_prompt(cm::Device::CPU); }
TEST(PrefixCache, SharedInFlightCpu) {
  prefix_cache_suite::shares_in_flight(cm::Device::CPU, true);
  prefix_cache_suite::shares_in_flight(cm::Device::CPU, false);
}
TEST(PrefixCache, OffReusesNothingCpu) { prefix_cache_suite::off_reuses_nothing(cm::Device::CPU); }
