// broadcast_batch (engine/batch_broadcast.h): rank 0's step plan reaches every rank of
// 2, 4 and 8 simulated ranks intact, round after round (plans of 0 rows
// included; the other ranks' own plans are ignored); a malformed plan on rank
// 0 makes every rank fail, none hang; and R ranks of expert parallelism stepped
// with rank 0's broadcast plans (the other ranks know no tokens) give the
// logits of one rank bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "common/error.h"
#include "factory/batch_broadcast.h"
#include "backend/cpu/cpu_backend.h"
#include "model/model.h"
#include "rank_util.h"
#include "step_util.h"

using namespace cm;

namespace {

// Half the plans carry undo flags (Batch::undo).
OwnedBatch random_plan(std::mt19937& rng, int32_t rows) {
  OwnedBatch p;
  const bool undo = rng() % 2;
  for (int32_t i = 0; i < rows; ++i) {
    p.token.push_back(int32_t(rng()));
    p.pos.push_back(int32_t(rng() % 100000));
    p.slot.push_back(int32_t(rng() % 64));
    p.logits.push_back(uint8_t(rng() % 2));
    if (undo) p.undo.push_back(uint8_t(rng() % 2));
  }
  return p;
}

// Undo flags all 0 arrive as none (the same batch).
bool same(const OwnedBatch& a, const OwnedBatch& b) {
  auto flags = [](const OwnedBatch& p) {
    return std::any_of(p.undo.begin(), p.undo.end(), [](uint8_t u) { return u != 0; }) ? p.undo : std::vector<uint8_t>{};
  };
  return a.token == b.token && a.pos == b.pos && a.slot == b.slot && a.logits == b.logits && flags(a) == flags(b);
}

TEST(BroadcastPlan, EveryRankGetsRankZerosPlan) {
  for (int R : {2, 4, 8}) {
    const std::vector<int32_t> sizes = {5, 0, 1, 300, 0, 17};
    std::vector<std::vector<OwnedBatch>> got(static_cast<size_t>(R));
    test::run_ranks(R, [&](Comm& comm) {
      std::mt19937 rng(7);  // every rank draws the same plans; only rank 0's may arrive
      std::mt19937 junk(100 + uint32_t(comm.rank()));
      for (int32_t n : sizes) {
        OwnedBatch mine = random_plan(rng, n);
        const OwnedBatch other = random_plan(junk, n + 3);  // what a non-root rank passes: ignored
        got[size_t(comm.rank())].push_back(broadcast_batch(comm, comm.rank() == 0 ? mine : other));
      }
    });
    std::mt19937 rng(7);
    for (size_t k = 0; k < sizes.size(); ++k) {
      const OwnedBatch want = random_plan(rng, sizes[k]);
      for (int r = 0; r < R; ++r) {
        EXPECT_TRUE(same(got[size_t(r)][k], want)) << "R=" << R << " rank " << r << " round " << k;
        EXPECT_EQ(got[size_t(r)][k].batch().n, sizes[k]);
      }
    }
  }
}

TEST(BroadcastPlan, MalformedPlanOnRankZeroFailsEveryRank) {
  const int R = 4;
  std::vector<std::string> msg(static_cast<size_t>(R));
  // A short timeout: a rank left waiting would fail the test by its timeout message, not hang it.
  EXPECT_THROW(test::run_ranks(
                   R,
                   [&](Comm& comm) {
                     OwnedBatch p;
                     p.token = {1, 2, 3};
                     p.pos = {0, 1};  // one short
                     p.slot = {0, 0, 0};
                     p.logits = {0, 0, 1};
                     try {
                       broadcast_batch(comm, p);
                     } catch (const Error& e) {
                       msg[size_t(comm.rank())] = e.what();
                       throw;
                     }
                   },
                   10),
               Error);
  EXPECT_NE(msg[0].find("lengths differ (3, 2, 3, 3)"), std::string::npos) << msg[0];
  for (int r = 1; r < R; ++r) EXPECT_NE(msg[size_t(r)].find("rank 0 could not send"), std::string::npos) << msg[size_t(r)];
}

// Expert parallelism (every rank runs the same batch) where only rank 0 knows the tokens: each step
// rank 0 plans a chunk, broadcast_batch ships it, every rank steps with it; rank 0's logits equal a
// one-rank run's bit for bit (prefill in chunks of 5, then the rest one token a step).
TEST(BroadcastPlan, RanksSteppedWithRankZerosPlansMatchOneRank) {
  const std::string dir = std::string(CLAWMINE_TEST_DATA) + "/golden/hf_text";
  const test::Expected g = test::read_expected(dir);
  const int64_t T = int64_t(g.tokens.size());
  const int64_t V = config_load(dir).vocab_size;
  auto one = model_load(dir);
  const std::vector<float> ref = test::cpu_logits(*one, g.tokens, 0);
  for (int R : {2, 4}) {
    std::vector<float> got(size_t(T * V), 0.f);
    test::run_ranks(R, [&](Comm& comm) {
      auto m = test::load_rank(dir, comm.rank(), R);
      BackendOptions opt;
      opt.ep_comm = &comm;
      CpuBackend be(*m, opt);
      be.reserve(CacheShape{1, 5, T});
      std::vector<float> out(size_t(5 * V));
      for (int64_t at = 0;;) {
        OwnedBatch p;  // rank 0's scheduler; the others pass an empty plan
        if (comm.rank() == 0 && at < T) {
          const int64_t len = at < 10 ? std::min<int64_t>(5, T - at) : 1;
          for (int64_t i = 0; i < len; ++i) {
            p.token.push_back(g.tokens[size_t(at + i)]);
            p.pos.push_back(int32_t(at + i));
            p.slot.push_back(0);
            p.logits.push_back(1);
          }
        }
        const OwnedBatch s = broadcast_batch(comm, p);
        if (s.rows() == 0) break;  // rank 0 has no more steps
        be.step(s.batch(), out.data());
        if (comm.rank() == 0) std::memcpy(got.data() + at * V, out.data(), size_t(s.rows() * V) * 4);
        at += s.rows();
      }
    });
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * 4), 0) << "R=" << R;
  }
}

}  // namespace
