// ThreadComm: every collective of comm.h on 2, 3, 4 and 8 simulated ranks with
// exact expected values, rank-order (deterministic) sums, reuse of the group
// over many calls, and a count mismatch that fails naming the ranks.
#include <gtest/gtest.h>

#include <atomic>

#include "common/error.h"
#include "rank_util.h"

using namespace cm;

namespace {

class CommTest : public ::testing::TestWithParam<int> {};

TEST_P(CommTest, AllReduceSum) {
  const int R = GetParam();
  test::run_ranks(R, [&](Comm& c) {
    EXPECT_EQ(c.size(), R);
    std::vector<float> f(5);
    std::vector<int32_t> n(5);
    for (int i = 0; i < 5; ++i) f[size_t(i)] = float(c.rank() * 100 + i) + 0.5f, n[size_t(i)] = c.rank() * 7 - i;
    c.all_reduce_sum(f.data(), 5);
    c.all_reduce_sum(n.data(), 5);
    for (int i = 0; i < 5; ++i) {
      float want = 0;
      int32_t wn = 0;
      for (int r = 0; r < R; ++r) want += float(r * 100 + i) + 0.5f, wn += r * 7 - i;
      EXPECT_EQ(f[size_t(i)], want);
      EXPECT_EQ(n[size_t(i)], wn);
    }
  });
}

// Values whose float sum depends on the order: the result must be the rank-order sum on every rank.
TEST_P(CommTest, SumsInRankOrder) {
  const int R = GetParam();
  auto val = [](int r) { return r % 2 == 0 ? 1.0e8f : 3.0f + float(r); };
  float want = val(0);
  for (int r = 1; r < R; ++r) want += val(r);
  test::run_ranks(R, [&](Comm& c) {
    float v = val(c.rank());
    c.all_reduce_sum(&v, 1);
    EXPECT_EQ(v, want);
    std::vector<float> s(size_t(R), val(c.rank())), out(1);
    c.reduce_scatter_sum(s.data(), 1, out.data());
    EXPECT_EQ(out[0], want);
  });
}

TEST_P(CommTest, AllGatherAndV) {
  const int R = GetParam();
  test::run_ranks(R, [&](Comm& c) {
    const int me = c.rank();
    float s[3] = {float(me * 10), float(me * 10 + 1), float(me * 10 + 2)};
    std::vector<float> g(size_t(3 * R), -1);
    c.all_gather(s, 3, g.data());
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 3; ++i) EXPECT_EQ(g[size_t(r * 3 + i)], float(r * 10 + i));
    // Rank r sends r elements (rank 0 none).
    std::vector<int64_t> counts(static_cast<size_t>(R));
    int64_t total = 0;
    for (int r = 0; r < R; ++r) counts[size_t(r)] = r, total += r;
    std::vector<int32_t> mine(size_t(me) + 1), all(size_t(total) + 1, -1);
    for (int i = 0; i < me; ++i) mine[size_t(i)] = me * 100 + i;
    c.all_gatherv(mine.data(), counts.data(), all.data());
    int64_t at = 0;
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < r; ++i) EXPECT_EQ(all[size_t(at++)], r * 100 + i);
    EXPECT_EQ(all[size_t(total)], -1);  // nothing written past the end
  });
}

TEST_P(CommTest, ReduceScatter) {
  const int R = GetParam();
  test::run_ranks(R, [&](Comm& c) {
    const int me = c.rank(), n = 4;
    std::vector<int32_t> s(static_cast<size_t>(R * n)), out(static_cast<size_t>(n));
    for (int q = 0; q < R; ++q)
      for (int i = 0; i < n; ++i) s[size_t(q * n + i)] = me * 1000 + q * 10 + i;
    c.reduce_scatter_sum(s.data(), n, out.data());
    for (int i = 0; i < n; ++i) {
      int32_t want = 0;
      for (int r = 0; r < R; ++r) want += r * 1000 + me * 10 + i;
      EXPECT_EQ(out[size_t(i)], want);
    }
  });
}

TEST_P(CommTest, AllToAllAndV) {
  const int R = GetParam();
  test::run_ranks(R, [&](Comm& c) {
    const int me = c.rank();
    // all_to_all: 2 elements per peer.
    std::vector<float> s(size_t(2 * R)), r(size_t(2 * R));
    for (int q = 0; q < R; ++q) s[size_t(2 * q)] = float(me * 100 + q), s[size_t(2 * q + 1)] = -float(me * 100 + q);
    c.all_to_all(s.data(), 2, r.data());
    for (int q = 0; q < R; ++q) {
      EXPECT_EQ(r[size_t(2 * q)], float(q * 100 + me));
      EXPECT_EQ(r[size_t(2 * q + 1)], -float(q * 100 + me));
    }
    // all_to_allv: me sends (me + q) % 3 elements to q (zero-length blocks included).
    std::vector<int64_t> sc(static_cast<size_t>(R)), rc(static_cast<size_t>(R));
    std::vector<int32_t> sv, rv;
    for (int q = 0; q < R; ++q) {
      sc[size_t(q)] = (me + q) % 3, rc[size_t(q)] = (q + me) % 3;
      for (int i = 0; i < sc[size_t(q)]; ++i) sv.push_back(me * 100 + q * 10 + i);
    }
    int64_t nr = 0;
    for (int q = 0; q < R; ++q) nr += rc[size_t(q)];
    rv.assign(size_t(nr) + 1, -7);
    sv.push_back(0);
    c.all_to_allv(sv.data(), sc.data(), rv.data(), rc.data());
    int64_t at = 0;
    for (int q = 0; q < R; ++q)
      for (int i = 0; i < rc[size_t(q)]; ++i) EXPECT_EQ(rv[size_t(at++)], q * 100 + me * 10 + i);
    EXPECT_EQ(rv[size_t(nr)], -7);
  });
}

// The group's barrier is reusable: many rounds in a row keep every rank in step.
TEST_P(CommTest, ManyRounds) {
  const int R = GetParam();
  std::atomic<int> round_sum{0};
  test::run_ranks(R, [&](Comm& c) {
    for (int k = 0; k < 200; ++k) {
      int32_t v = k + c.rank();
      c.all_reduce_sum(&v, 1);
      EXPECT_EQ(v, R * k + R * (R - 1) / 2);
      c.barrier();
    }
    round_sum += 1;
  });
  EXPECT_EQ(round_sum.load(), R);
}

// A rank whose counts disagree with its peer's is an error naming both ranks.
TEST_P(CommTest, CountMismatchIsAnError) {
  const int R = GetParam();
  try {
    test::run_ranks(R, [&](Comm& c) {
      std::vector<int64_t> sc(size_t(R), 1), rc(size_t(R), 2);
      std::vector<float> s(static_cast<size_t>(R)), r(size_t(2 * R));
      c.all_to_allv(s.data(), sc.data(), r.data(), rc.data());
    });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expects 2 elements from rank"), std::string::npos) << e.what();
  }
}

// A rank that dies (returns without joining the collective) ends the others'
// wait with an error naming it, not a hang.
TEST_P(CommTest, DeadRankIsNamedNotAHang) {
  const int R = GetParam();
  if (R < 2) GTEST_SKIP() << "needs a peer";
  try {
    test::run_ranks(
        R,
        [&](Comm& c) {
          if (c.rank() == R - 1) return;  // dies before the collective
          float v = 1;
          c.all_reduce_sum(&v, 1);
        },
        0.2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for rank(s) " + std::to_string(R - 1)), std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommTest, ::testing::Values(1, 2, 3, 4, 8));

TEST(ExpertOwner, RangesCoverEveryExpertOnce) {
  for (int64_t E : {1, 7, 8, 16, 256})
    for (int R : {1, 2, 3, 4, 5, 8}) {
      for (int64_t e = 0; e < E; ++e) {
        const int r = expert_owner(E, e, R);
        EXPECT_LE(expert_first(E, r, R), e);
        EXPECT_LT(e, expert_first(E, r + 1, R));
      }
      EXPECT_EQ(expert_first(E, R, R), E);
    }
}

}  // namespace
