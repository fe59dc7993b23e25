// The engine seam on every device (the suite is tests/seam_suite.h) and the
// CPU-only seam checks: chunking is bit-exact, bytes_per_slot and reserve limits, a reserved step
// allocates nothing.
#include <atomic>
#include <cstdlib>
#include <new>

#include "seam_suite.h"
#include "factory/factory.h"

namespace seam_suite {

// Chunking does not change a row's bits on the CPU: one prefill, chunks of 1
// and chunks of 7 agree exactly (every op is per row or per slot state).
TEST(SeamCpu, ChunkingIsBitExact) {
  auto m = model_load(kData + "/golden/release_real_ratios");
  Expected e = read_expected(kData + "/golden/release_real_ratios");
  std::vector<float> a = test::cpu_logits(*m, e.tokens, 0), b = test::cpu_logits(*m, e.tokens, 1),
                     c = test::cpu_logits(*m, e.tokens, 7);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << max_abs(a, b);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0) << max_abs(a, c);
}

TEST(SeamCpu, BytesPerSlotAndReserveLimits) {
  auto m = model_load(kData + "/golden/hf_mixed_yarn");
  auto be = make_backend(*m, Device::CPU);
  const size_t b1 = be->bytes_per_slot(CacheShape{1, 1, 64}), b2 = be->bytes_per_slot(CacheShape{1, 1, 128});
  EXPECT_GT(b1, 0u);
  EXPECT_GT(b2, b1);  // entries grow with the context
  EXPECT_THROW(be->reserve(CacheShape{0, 4, 64}), Error);
  EXPECT_THROW(be->reserve(CacheShape{1, 0, 64}), Error);
  EXPECT_THROW(be->reserve(CacheShape{1, 4, m->config.max_position_embeddings + 1}), Error);
  std::vector<float> out(size_t(m->config.vocab_size));
  const int32_t t[] = {1}, p[] = {0}, s[] = {0};
  const uint8_t w[] = {1};
  EXPECT_THROW(be->step(Batch{1, t, p, s, w}, out.data()), Error);  // not reserved
}

INSTANTIATE_TEST_SUITE_P(Devices, Seam, ::testing::Values(Device::CPU, Device::CUDA),
                         [](const ::testing::TestParamInfo<Device>& i) { return std::string(device_name(i.param)); });
CM_SEAM_FIXTURE_SUITES(Devices, ::testing::Values(Device::CPU, Device::CUDA));

}  // namespace seam_suite

// Every allocation of the test binary is counted while `g_count_allocs` is set:
// a reserved CPU step (prefill and decode, with several slots) allocates nothing.
namespace {
std::atomic<bool> g_count_allocs{false};
std::atomic<int64_t> g_allocs{0};
}  // namespace

// Every unaligned form is replaced together: a sanitizer (or the standard library's nothrow
// temporary buffers in std::stable_sort) would otherwise pair its own new with our free.
namespace {
void* counted_malloc(size_t n) noexcept {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
}  // namespace

void* operator new(size_t n) {
  if (void* p = counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  if (void* p = counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(size_t n, const std::nothrow_t&) noexcept { return counted_malloc(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return counted_malloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace seam_suite {

TEST(SeamCpu, StepAllocatesNothing) {
  auto m = model_load(kData + "/golden_quant_nvfp4");
  const int64_t V = m->config.vocab_size;
  auto be = test::reserved_backend(*m, Device::CPU, 2, 16, 64);
  std::vector<int32_t> tok(16, 7), pos(16), slot(16);
  std::vector<uint8_t> want(16, 1);
  std::vector<float> out(size_t(16 * V));
  auto run = [&](int32_t n, int32_t s0_rows) {  // s0_rows rows of slot 0, the rest slot 1
    for (int32_t i = 0; i < n; ++i) {
      slot[size_t(i)] = i < s0_rows ? 0 : 1;
      pos[size_t(i)] = int32_t(be->slot_pos(slot[size_t(i)]) + (i < s0_rows ? i : i - s0_rows));
    }
    be->step(Batch{n, tok.data(), pos.data(), slot.data(), want.data()}, out.data());
  };
  run(12, 5);  // warm-up: thread-local panels reach their size
  g_allocs = 0;
  g_count_allocs = true;
  run(16, 9);  // prefill chunks of both slots
  run(2, 1);   // one decode token each
  const int64_t during_steps = g_allocs.load();
  std::vector<int> probe(3);  // the counter itself works
  g_count_allocs = false;
  EXPECT_EQ(during_steps, 0);
  EXPECT_EQ(g_allocs.load(), 1);
}

}  // namespace seam_suite
