// The MTP block on a backend (CPU: backend/cpu/mtp_block.cpp, CUDA: backend/cuda/cuda_mtp_block.cu), a
// suite instantiated per device (tests/test_mtp_draft.cpp, tests/gpu/test_mtp_cuda.cpp): the window rows
// each step feeds it and the hidden ring are the same bits however a prompt is chunked or batched;
// draft() leaves no trace, its first j drafts do not depend on how many follow, and a slot rolled back
// after speculation drafts what a slot that never speculated drafts; errors name the problem.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/error.h"
#include "factory/factory.h"
#include "mtp_fixture.h"
#include "step_util.h"

namespace mtp_draft_suite {

using namespace cm;
using namespace cm::test::mtp;
using cm::test::error_of;

inline std::vector<int32_t> random_tokens(int64_t n, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t((size_t(n)));
  for (int32_t& x : t) x = int32_t(rng() % uint32_t(V));
  return t;
}

inline std::vector<int32_t> draft(ModelBackend& be, std::vector<int32_t> slots, std::vector<int32_t> next, int32_t k,
                                  const SampleParams* params = nullptr) {
  std::vector<int32_t> out(slots.size() * size_t(k), -1);
  DraftRequest r;
  r.n = int32_t(slots.size()), r.slot = slots.data(), r.token = next.data(), r.params = params, r.k = k;
  r.out = out.data();
  be.draft(r);
  return out;
}

class MtpDraft : public ::testing::TestWithParam<Device> {};

TEST_P(MtpDraft, StateIsChunkAndBatchInvariant) {
  const Device dev = GetParam();
  if (!device_available(dev)) GTEST_SKIP() << "no " << device_name(dev) << " device";
  auto m = mtp_model();
  const int64_t V = m->config.vocab_size, T = 37;
  const std::vector<int32_t> toks = random_tokens(T, V, 3);
  auto whole = test::reserved_backend(*m, dev, 2, 64, 64);
  ASSERT_TRUE(whole->has_mtp());
  test::feed_chunks(*whole, 0, toks.data(), T, 0, V);
  for (int64_t chunk : {1, 7}) {
    auto be = test::reserved_backend(*m, dev, 2, 64, 64);
    test::feed_chunks(*be, 1, toks.data(), T, chunk, V);
    EXPECT_TRUE(be->slot_state(1) == whole->slot_state(0)) << "chunks of " << chunk;
    // And what the block drafts from there.
    EXPECT_EQ(draft(*be, {1}, {toks[5]}, 3), draft(*whole, {0}, {toks[5]}, 3)) << "chunks of " << chunk;
  }
  // The model without its MTP block: the same logits (the block changes no main-model bit).
  LoadOptions plain;
  auto m0 = model_load(kRelease, plain);
  auto be0 = test::reserved_backend(*m0, dev, 1, 64, 64);
  EXPECT_FALSE(be0->has_mtp());
  auto be1 = test::reserved_backend(*m, dev, 1, 64, 64);
  const std::vector<float> a = test::feed_chunks(*be0, 0, toks.data(), T, 5, V);
  const std::vector<float> b = test::feed_chunks(*be1, 0, toks.data(), T, 5, V);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST_P(MtpDraft, LeavesNoTraceAndIsPrefixConsistent) {
  const Device dev = GetParam();
  if (!device_available(dev)) GTEST_SKIP() << "no " << device_name(dev) << " device";
  auto m = mtp_model();
  const int64_t V = m->config.vocab_size;
  auto be = test::reserved_backend(*m, dev, 3, 64, 96);
  const std::vector<int32_t> a = random_tokens(20, V, 4), b = random_tokens(9, V, 5);
  test::feed_chunks(*be, 0, a.data(), 20, 6, V);
  test::feed_chunks(*be, 2, b.data(), 9, 0, V);
  const std::vector<uint8_t> s0 = be->slot_state(0), s2 = be->slot_state(2);
  const std::vector<int32_t> d7 = draft(*be, {2, 0}, {17, 3}, 7);
  EXPECT_TRUE(be->slot_state(0) == s0);
  EXPECT_TRUE(be->slot_state(2) == s2);
  EXPECT_EQ(be->slot_pos(0), 20);
  for (int32_t k = 1; k <= 3; ++k) {
    const std::vector<int32_t> dk = draft(*be, {2, 0}, {17, 3}, k);
    for (int32_t j = 0; j < k; ++j) {
      EXPECT_EQ(dk[size_t(j)], d7[size_t(j)]) << "slot 2, k " << k;
      EXPECT_EQ(dk[size_t(k + j)], d7[size_t(7 + j)]) << "slot 0, k " << k;
    }
  }
  // A slot drafts the same alone as beside another.
  const std::vector<int32_t> alone = draft(*be, {0}, {3}, 7);
  EXPECT_TRUE(std::equal(alone.begin(), alone.end(), d7.begin() + 7));
  for (int32_t t : d7) EXPECT_TRUE(t >= 0 && t < V);
  // Sampled drafts: the seed decides, the same again; another seed, other drafts (over 8 slots' worth).
  std::vector<SampleParams> p(2);
  p[0].temperature = p[1].temperature = 1.5f, p[0].seed = 9, p[1].seed = 10;
  const std::vector<int32_t> s1 = draft(*be, {2, 0}, {17, 3}, 7, p.data());
  EXPECT_EQ(s1, draft(*be, {2, 0}, {17, 3}, 7, p.data()));
  p[0].seed = 99, p[1].seed = 100;
  EXPECT_NE(s1, draft(*be, {2, 0}, {17, 3}, 7, p.data()));
  EXPECT_TRUE(be->slot_state(0) == s0);
  // The next step after drafting equals one with no draft before it.
  auto ref = test::reserved_backend(*m, dev, 3, 64, 96);
  test::feed_chunks(*ref, 0, a.data(), 20, 6, V);
  const int32_t nt[] = {3, 8};
  const std::vector<float> x = test::feed_chunks(*be, 0, nt, 2, 0, V), y = test::feed_chunks(*ref, 0, nt, 2, 0, V);
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0);
  EXPECT_TRUE(be->slot_state(0) == ref->slot_state(0));
}

// Verify-and-roll-back rounds with the block's state: after each, the slot equals one that saw only the
// accepted tokens, and both draft the same tokens.
TEST_P(MtpDraft, RollbackRestoresTheBlocksWindowAndHiddenRing) {
  const Device dev = GetParam();
  if (!device_available(dev)) GTEST_SKIP() << "no " << device_name(dev) << " device";
  auto m = mtp_model();
  const int64_t V = m->config.vocab_size;
  auto sp = test::reserved_backend(*m, dev, 1, 16, 128);
  auto ref = test::reserved_backend(*m, dev, 1, 16, 128);
  const int64_t lim = sp->undo_token_limit();
  ASSERT_GE(lim, 2);
  const std::vector<int32_t> prompt = random_tokens(11, V, 6);
  test::feed_chunks(*sp, 0, prompt.data(), 11, 0, V);
  test::feed_chunks(*ref, 0, prompt.data(), 11, 0, V);
  std::mt19937 rng(12);
  int32_t next = 5;
  for (int round = 0; round < 25 && sp->slot_pos(0) + lim < 120; ++round) {
    const int32_t k = int32_t(1 + rng() % uint32_t(lim - 1));
    std::vector<int32_t> run{next};
    for (int32_t d : draft(*sp, {0}, {next}, k)) run.push_back(rng() % 2 ? d : int32_t(rng() % uint32_t(V)));
    const int64_t p0 = sp->slot_pos(0);
    std::vector<int32_t> pos(run.size()), slot(run.size(), 0);
    std::vector<uint8_t> want(run.size(), 1);
    for (size_t i = 0; i < run.size(); ++i) pos[i] = int32_t(p0 + int64_t(i));
    std::vector<float> logits(run.size() * size_t(V));
    Batch b{int32_t(run.size()), run.data(), pos.data(), slot.data(), want.data()};
    b.undo = want.data();  // every row: undoable
    sp->step(b, logits.data());
    const int64_t acc = 1 + int64_t(rng() % run.size());
    sp->rollback_slot(0, p0 + acc);
    test::feed_chunks(*ref, 0, run.data(), acc, 0, V);
    ASSERT_TRUE(sp->slot_state(0) == ref->slot_state(0)) << "round " << round << ": " << acc << " of " << run.size();
    next = int32_t(rng() % uint32_t(V));
    ASSERT_EQ(draft(*sp, {0}, {next}, 3), draft(*ref, {0}, {next}, 3)) << "round " << round;
  }
}

TEST_P(MtpDraft, ErrorsNameTheProblem) {
  const Device dev = GetParam();
  if (!device_available(dev)) GTEST_SKIP() << "no " << device_name(dev) << " device";
  auto m = mtp_model();
  auto be = test::reserved_backend(*m, dev, 2, 8, 16);
  const int64_t V = m->config.vocab_size;
  EXPECT_NE(error_of([&] { draft(*be, {0}, {1}, 2); }).find("slot 0 holds no token"), std::string::npos);
  const std::vector<int32_t> t = random_tokens(12, V, 8);
  test::feed_chunks(*be, 0, t.data(), 12, 4, V);
  EXPECT_NE(error_of([&] { draft(*be, {0}, {1}, 8); }).find("outside [1, 7]"), std::string::npos);
  EXPECT_NE(error_of([&] { draft(*be, {0}, {1}, 6); }).find("pass the reserved context of 16"), std::string::npos);
  EXPECT_NE(error_of([&] { draft(*be, {0, 0}, {1, 2}, 1); }).find("slot 0 appears twice"), std::string::npos);
  EXPECT_NE(error_of([&] { draft(*be, {0}, {int32_t(V)}, 1); }).find("outside [0, "), std::string::npos);
  LoadOptions plain;
  auto m0 = model_load(kRelease, plain);
  auto be0 = test::reserved_backend(*m0, dev, 1, 8, 16);
  test::feed_chunks(*be0, 0, t.data(), 3, 0, V);
  EXPECT_NE(error_of([&] { draft(*be0, {0}, {1}, 1); }).find("without its MTP block"), std::string::npos);
}

}  // namespace mtp_draft_suite
