// The engine seam, one suite over devices (CTranslate2 style): every golden
// fixture through ModelBackend::step() as one prefill, in chunks of 1 and 7,
// and as one batch of 8 sequences of different lengths mixing prefill chunks
// and decode tokens, each of which must equal its own lone run bit for bit.
// Also: over-reservation errors (state untouched), copy_slot, reset_slot.
// The cuda parameter skips itself when the build or the machine has no GPU
// backend; the CPU bound is max|Δ| ≤ 1e-4 against transformers' fp32 logits.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <cstring>
#include <random>

#include "common/error.h"
#include "engine/backend.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "step_util.h"

using namespace cm;

using test::Expected;
using test::read_expected;

namespace {

const std::string kData = CLAWMINE_TEST_DATA;
const char* kFixtures[] = {"golden/hf_mixed_yarn", "golden/release_real_ratios", "golden/hf_hca_window",
                           "golden/hf_text",       "golden_quant_nvfp4",         "golden_quant_release"};

double max_abs(const std::vector<float>& a, const std::vector<float>& b, double* ref_amax = nullptr) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0, r = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double x = std::fabs(double(a[i]) - double(b[i]));
    if (!(x <= d)) d = x;  // NaN propagates
    r = std::max(r, std::fabs(double(b[i])));
  }
  if (ref_amax) *ref_amax = r;
  return d;
}

class Seam : public ::testing::TestWithParam<Device> {
 protected:
  // A reserved backend of the parameter's device, or a skip when there is none.
  std::unique_ptr<ModelBackend> backend(const Model& m, int32_t slots, int32_t step_tokens, int64_t ctx) {
    try {
      return test::reserved_backend(m, GetParam(), slots, step_tokens, ctx);
    } catch (const Error& e) {
      if (GetParam() == Device::CPU) throw;
      return nullptr;
    }
  }
  // The logits bound against transformers for this device.
  void expect_close(const std::vector<float>& got, const Expected& e, const std::string& what) {
    double amax = 0;
    const double d = max_abs(got, e.logits, &amax);
    if (GetParam() == Device::CPU) EXPECT_LE(d, 1e-4) << what;
    else EXPECT_LE(d, 0.03 * amax) << what;  // bf16 activations
    std::printf("  %s: max |logits - transformers| = %.3g (max |logit| %.3g)\n", what.c_str(), d, amax);
  }
};

TEST_P(Seam, GoldenFixturesPrefillAndChunks) {
  for (const char* name : kFixtures) {
    const std::string dir = kData + "/" + name;
    auto m = model_load(dir);
    Expected e = read_expected(dir);
    const int64_t T = int64_t(e.tokens.size()), V = m->config.vocab_size;
    for (int64_t chunk : {T, int64_t(1), int64_t(7)}) {
      auto be = backend(*m, 1, int32_t(chunk), T);
      if (!be) GTEST_SKIP() << "no " << device_name(GetParam()) << " backend here";
      std::vector<float> l = test::feed_chunks(*be, 0, e.tokens.data(), T, chunk, V);
      expect_close(l, e, std::string(name) + " chunk " + std::to_string(chunk));
    }
  }
}

// Eight sequences of different lengths share every step: each step takes the
// next piece of every unfinished sequence (prefill chunks of varying size for
// some, one decode token for others), in a shuffled slot order. Every
// sequence's rows must equal its own lone run with the same pieces, bit for bit.
TEST_P(Seam, MixedBatchEqualsLoneRuns) {
  for (const char* name : {"golden/hf_mixed_yarn", "golden_quant_nvfp4"}) {
    auto m = model_load(kData + "/" + name);
    const int64_t V = m->config.vocab_size;
    std::mt19937 rng(7);
    const int S = 8;
    std::vector<std::vector<int32_t>> seqs(S);
    for (int s = 0; s < S; ++s) {
      seqs[size_t(s)].resize(size_t(9 + 11 * s));
      for (int32_t& t : seqs[size_t(s)]) t = int32_t(rng() % uint32_t(V));
    }
    // Pieces per sequence: 1..13 tokens (1 = a decode step), random.
    std::vector<std::vector<int32_t>> pieces(S);
    for (int s = 0; s < S; ++s)
      for (int64_t done = 0; done < int64_t(seqs[size_t(s)].size());) {
        int32_t n = int32_t(std::min<int64_t>(1 + rng() % 13, int64_t(seqs[size_t(s)].size()) - done));
        if (done > 20 && rng() % 2) n = 1;
        pieces[size_t(s)].push_back(n);
        done += n;
      }
    auto be = backend(*m, S, 8 * 13, 128);
    if (!be) GTEST_SKIP() << "no " << device_name(GetParam()) << " backend here";
    std::vector<std::vector<float>> batched(S);
    std::vector<size_t> next(S, 0), done(S, 0);
    std::vector<int> order(S);
    for (int s = 0; s < S; ++s) order[size_t(s)] = s;
    while (true) {
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<int32_t> tok, pos, slot;
      std::vector<uint8_t> want;
      for (int s : order) {
        if (next[size_t(s)] == pieces[size_t(s)].size()) continue;
        const int32_t n = pieces[size_t(s)][next[size_t(s)]++];
        for (int32_t j = 0; j < n; ++j) {
          tok.push_back(seqs[size_t(s)][done[size_t(s)] + size_t(j)]);
          pos.push_back(int32_t(done[size_t(s)]) + j);
          slot.push_back(s);
          want.push_back(1);
        }
        done[size_t(s)] += size_t(n);
      }
      if (tok.empty()) break;
      std::vector<float> out(tok.size() * size_t(V));
      be->step(Batch{int32_t(tok.size()), tok.data(), pos.data(), slot.data(), want.data()}, out.data());
      for (size_t r = 0; r < tok.size(); ++r)
        batched[size_t(slot[r])].insert(batched[size_t(slot[r])].end(), out.begin() + long(r * size_t(V)),
                                        out.begin() + long((r + 1) * size_t(V)));
    }
    for (int s = 0; s < S; ++s) {
      auto lone = backend(*m, 1, 13, 128);
      std::vector<float> ref;
      int64_t at = 0;
      for (int32_t n : pieces[size_t(s)]) {
        std::vector<float> l = test::feed_chunks(*lone, 0, seqs[size_t(s)].data() + at, n, 0, V);
        ref.insert(ref.end(), l.begin(), l.end());
        at += n;
      }
      ASSERT_EQ(batched[size_t(s)].size(), ref.size()) << name << " seq " << s;
      EXPECT_EQ(std::memcmp(batched[size_t(s)].data(), ref.data(), ref.size() * 4), 0)
          << name << " seq " << s << ": batched rows differ from the lone run (max |Δ| "
          << max_abs(batched[size_t(s)], ref) << ")";
    }
  }
}

TEST_P(Seam, OverReservationIsAnErrorAndChangesNothing) {
  auto m = model_load(kData + "/golden/hf_hca_window");
  const int64_t V = m->config.vocab_size;
  auto be = backend(*m, 2, 4, 16);
  if (!be) GTEST_SKIP() << "no " << device_name(GetParam()) << " backend here";
  std::vector<int32_t> toks = {5, 9, 3, 7, 11, 2};
  std::vector<float> ref = test::feed_chunks(*be, 0, toks.data(), 3, 0, V);
  auto err = [&](const Batch& b) {
    std::vector<float> out(size_t(8 * V));
    try {
      be->step(b, out.data());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const int32_t pos5[] = {3, 4, 5, 6, 7}, s0[] = {0, 0, 0, 0, 0};
  const uint8_t w[] = {1, 1, 1, 1, 1};
  EXPECT_NE(err(Batch{5, toks.data(), pos5, s0, w}).find("exceed the reserved max_step_tokens of 4"),
            std::string::npos);
  const int32_t s2[] = {2};
  EXPECT_NE(err(Batch{1, toks.data(), pos5, s2, w}).find("slot 2 outside the reserved [0, 2)"), std::string::npos);
  const int32_t bad_pos[] = {4};
  EXPECT_NE(err(Batch{1, toks.data(), bad_pos, s0, w}).find("does not continue slot 0 (expected 3)"),
            std::string::npos);
  const int32_t split_slots[] = {1, 0, 1}, split_pos[] = {0, 3, 1};
  EXPECT_NE(err(Batch{3, toks.data(), split_pos, split_slots, w}).find("not contiguous"), std::string::npos);
  const int32_t bad_tok[] = {int32_t(V)};
  EXPECT_NE(err(Batch{1, bad_tok, pos5, s0, w}).find("outside the vocabulary"), std::string::npos);
  // Context: slot 1 filled to 16, then one more.
  std::vector<int32_t> fill(16, 4);
  test::feed_chunks(*be, 1, fill.data(), 16, 4, V);
  const int32_t p16[] = {16}, s1[] = {1};
  EXPECT_NE(err(Batch{1, toks.data(), p16, s1, w}).find("past the reserved context of 16"), std::string::npos);
  // Nothing above touched slot 0: continuing it equals one uninterrupted run.
  EXPECT_EQ(be->slot_pos(0), 3);
  std::vector<float> rest = test::feed_chunks(*be, 0, toks.data() + 3, 3, 0, V);
  auto fresh = backend(*m, 1, 6, 16);
  std::vector<float> whole = test::feed_chunks(*fresh, 0, toks.data(), 6, 0, V);
  ref.insert(ref.end(), rest.begin(), rest.end());
  EXPECT_EQ(std::memcmp(ref.data(), whole.data(), whole.size() * 4), 0);
}

// copy_slot then continuing the copy equals continuing the original; a reset
// slot reused for another sequence equals a fresh backend.
TEST_P(Seam, CopySlotAndResetSlot) {
  auto m = model_load(kData + "/golden/hf_mixed_yarn");
  Expected e = read_expected(kData + "/golden/hf_mixed_yarn");
  const int64_t V = m->config.vocab_size, T = int64_t(e.tokens.size()), half = T / 2 + 3;
  auto be = backend(*m, 3, int32_t(T), T);
  if (!be) GTEST_SKIP() << "no " << device_name(GetParam()) << " backend here";
  test::feed_chunks(*be, 0, e.tokens.data(), half, 5, V);
  be->copy_slot(0, 2);
  EXPECT_EQ(be->slot_pos(2), half);
  std::vector<float> from_copy = test::feed_chunks(*be, 2, e.tokens.data() + half, T - half, 3, V);
  std::vector<float> from_orig = test::feed_chunks(*be, 0, e.tokens.data() + half, T - half, 3, V);
  EXPECT_EQ(std::memcmp(from_copy.data(), from_orig.data(), from_orig.size() * 4), 0);
  // The copy's rows also match transformers.
  std::vector<float> tail(e.logits.begin() + long(half * V), e.logits.end());
  EXPECT_LE(max_abs(from_copy, tail), GetParam() == Device::CPU ? 1e-4 : 1e9);

  be->reset_slot(0);
  EXPECT_EQ(be->slot_pos(0), 0);
  std::vector<float> again = test::feed_chunks(*be, 0, e.tokens.data(), T, 0, V);
  auto fresh = backend(*m, 1, int32_t(T), T);
  std::vector<float> ref = test::feed_chunks(*fresh, 0, e.tokens.data(), T, 0, V);
  EXPECT_EQ(std::memcmp(again.data(), ref.data(), ref.size() * 4), 0);
}

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

}  // namespace

// Every allocation of the test binary is counted while `g_count_allocs` is set:
// a reserved CPU step (prefill and decode, with several slots) allocates nothing.
namespace {
std::atomic<bool> g_count_allocs{false};
std::atomic<int64_t> g_allocs{0};
}  // namespace

void* operator new(size_t n) {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

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
