// The MTP block on the CUDA backend (backend/cuda/cuda_mtp_block.cu): the MTP suite (tests/mtp_draft_suite.h),
// graphs against eager launches, the engine's speculative decoding on the GPU giving every job the tokens
// it gets without MTP, and the default model's trained block drafting on the GPU what it drafts on the CPU.
#include "../engine_mtp_util.h"
#include "../mtp_draft_suite.h"

namespace mtp_draft_suite {

INSTANTIATE_TEST_SUITE_P(Gpu, MtpDraft, ::testing::Values(Device::CUDA),
                         [](const ::testing::TestParamInfo<Device>& i) { return std::string(device_name(i.param)); });

}  // namespace mtp_draft_suite

namespace {

using namespace cm;
using namespace cm::test::mtp;
using namespace cm::test::engine_mtp;
using mtp_draft_suite::draft;
using mtp_draft_suite::random_tokens;

// Drafts from captured graphs are the eager launches' bits: the same tokens (greedy and sampled, one slot
// and two), and the same state after a verify step and its rollback.
TEST(MtpCuda, GraphsGiveTheEagerDrafts) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  auto m = mtp_model();
  const int64_t V = m->config.vocab_size;
  BackendOptions eager_opt;
  eager_opt.cuda_graphs = false;
  auto graph = test::reserved_backend(*m, Device::CUDA, 2, 32, 96);
  auto eager = test::reserved_backend(*m, Device::CUDA, 2, 32, 96, eager_opt);
  const std::vector<int32_t> a = random_tokens(29, V, 31), b = random_tokens(6, V, 32);
  for (ModelBackend* be : {graph.get(), eager.get()}) {
    test::feed_chunks(*be, 0, a.data(), 29, 5, V);
    test::feed_chunks(*be, 1, b.data(), 6, 0, V);
  }
  std::vector<SampleParams> p(2);
  p[0].temperature = p[1].temperature = 1.2f, p[0].seed = 4, p[1].seed = 5, p[1].top_k = 20;
  for (int round = 0; round < 3; ++round) {  // the second and third replay what the first captured
    EXPECT_EQ(draft(*graph, {0, 1}, {7, 9}, 5), draft(*eager, {0, 1}, {7, 9}, 5)) << "round " << round;
    EXPECT_EQ(draft(*graph, {1}, {3}, 7, p.data() + 1), draft(*eager, {1}, {3}, 7, p.data() + 1)) << "round " << round;
    EXPECT_EQ(draft(*graph, {0, 1}, {2, 8}, 3, p.data()), draft(*eager, {0, 1}, {2, 8}, 3, p.data()));
  }
  EXPECT_TRUE(graph->slot_state(0) == eager->slot_state(0));
  EXPECT_TRUE(graph->slot_state(1) == eager->slot_state(1));
  // A verify run of 4 rows, rolled back to 2: the same state either way.
  for (ModelBackend* be : {graph.get(), eager.get()}) {
    const int64_t p0 = be->slot_pos(0);
    std::vector<int32_t> run = {7, 1, 2, 3}, pos(4), slot(4, 0);
    std::vector<uint8_t> want(4, 1);
    for (int i = 0; i < 4; ++i) pos[size_t(i)] = int32_t(p0 + i);
    std::vector<float> logits(4 * size_t(V));
    Batch bt{4, run.data(), pos.data(), slot.data(), want.data()};
    bt.undo = want.data();
    be->step(bt, logits.data());
    be->rollback_slot(0, p0 + 2);
  }
  EXPECT_TRUE(graph->slot_state(0) == eager->slot_state(0));
  EXPECT_EQ(draft(*graph, {0}, {11}, 4), draft(*eager, {0}, {11}, 4));
}

// The engine on the GPU: with the MTP block drafting (graphs, and eager for one K), every job's tokens,
// logprobs and finish reason are those it has without MTP, where the plain run samples on the device.
TEST(EngineMtpCuda, SameTokensAsWithout) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  auto m = mtp_model();
  const int64_t V = m->config.vocab_size, ctx = 96;
  const std::vector<JobSpec> specs = mixed_jobs(V, ctx);
  auto plain_be = make_backend(*m, Device::CUDA);
  EngineOptions po = options(0, ctx);
  po.sample_on_device = true;
  Engine plain(*plain_be, nullptr, V, po, nullptr);
  const std::vector<Outcome> want = run_jobs(plain, specs);
  for (int32_t k : {1, 3, 7, -3}) {  // -3: K = 3 with every kernel launched eagerly
    BackendOptions bo;
    bo.cuda_graphs = k > 0;
    auto be = make_backend(*m, Device::CUDA, bo);
    ASSERT_TRUE(be->has_mtp());
    EngineOptions eo = options(std::abs(k), ctx);
    eo.sample_on_device = true;  // (verify rows too: sample_last_step draws them)
    Engine e(*be, nullptr, V, eo, nullptr);
    const std::vector<Outcome> got = run_jobs(e, specs);
    for (size_t i = 0; i < specs.size(); ++i)
      EXPECT_TRUE(got[i] == want[i]) << "--mtp " << k << " job " << i << ": " << got[i].ids.size() << " tokens ("
                                     << got[i].reason << ") vs " << want[i].ids.size() << " (" << want[i].reason << ")";
    const SpecStats& st = e.spec_stats();
    EXPECT_GT(st.rounds, 20) << "--mtp " << k;
    std::printf("  cuda --mtp %d: %lld rounds, %lld of %lld drafts accepted, %lld tokens in %lld steps\n", k,
                (long long)st.rounds, (long long)st.accepted, (long long)st.drafted, (long long)st.emitted,
                (long long)st.steps);
  }
}

// The default model's trained block: along a sequence the model itself continues greedily (on the CPU),
// the GPU's drafts are the CPU's (bf16 activations may flip a near tie: at least 85% of first drafts
// and of all drafts agree), and both accept about as often.
TEST(MtpCudaDefaultModel, DraftsAgreeWithTheCpu) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  LoadOptions lo;
  lo.mtp = true;
  auto m = model_load(std::string(CLAWMINE_TEST_DATA) + "/../../models/default", lo);
  ASSERT_FALSE(m->weights.mtp.empty());
  const int64_t V = m->config.vocab_size, T0 = 8, T = 72;
  std::vector<int32_t> seq = random_tokens(T0, V, 17);
  {
    auto be = test::reserved_backend(*m, Device::CPU, 1, 16, T + 8);
    std::vector<float> l = test::feed_chunks(*be, 0, seq.data(), T0, 0, V);
    const float* row = l.data() + (T0 - 1) * V;
    while (int64_t(seq.size()) < T) {
      seq.push_back(int32_t(std::max_element(row, row + V) - row));
      l = test::feed_chunks(*be, 0, &seq.back(), 1, 0, V);
      row = l.data();
    }
  }
  auto cpu = test::reserved_backend(*m, Device::CPU, 1, 16, T + 8);
  auto gpu = test::reserved_backend(*m, Device::CUDA, 1, 16, T + 8);
  test::feed_chunks(*cpu, 0, seq.data(), T0, 0, V);
  test::feed_chunks(*gpu, 0, seq.data(), T0, 0, V);
  const int32_t k = 3;
  int64_t n = 0, first = 0, all = 0, acc_cpu = 0, acc_gpu = 0;
  for (int64_t t = T0; t + 1 < T; ++t) {  // the slots hold seq[0, t); the next token is seq[t]
    const std::vector<int32_t> dc = draft(*cpu, {0}, {seq[size_t(t)]}, k), dg = draft(*gpu, {0}, {seq[size_t(t)]}, k);
    ++n;
    first += dc[0] == dg[0];
    for (int32_t j = 0; j < k; ++j) all += dc[size_t(j)] == dg[size_t(j)];
    acc_cpu += dc[0] == seq[size_t(t + 1)];
    acc_gpu += dg[0] == seq[size_t(t + 1)];
    test::feed_chunks(*cpu, 0, &seq[size_t(t)], 1, 0, V);
    test::feed_chunks(*gpu, 0, &seq[size_t(t)], 1, 0, V);
  }
  std::printf("  default model: first drafts agree %lld/%lld, all %lld/%lld; first draft = the model's next token: "
              "cpu %lld, cuda %lld\n",
              (long long)first, (long long)n, (long long)all, (long long)(n * k), (long long)acc_cpu,
              (long long)acc_gpu);
  EXPECT_GE(double(first), 0.85 * double(n));
  EXPECT_GE(double(all), 0.85 * double(n * k));
  EXPECT_LE(std::abs(acc_cpu - acc_gpu), n / 10 + 1);
  EXPECT_GE(acc_gpu, n / 4);  // the trained block predicts the model's own continuation
}

}  // namespace
