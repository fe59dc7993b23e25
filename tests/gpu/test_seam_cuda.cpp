// The engine seam's suite (tests/seam_suite.h) on the CUDA backend, in the GPU
// test binary so the device run executes it: golden fixtures vs transformers,
// the mixed batch vs lone runs, determinism, reservation errors, copy/reset.
#include "../seam_suite.h"
#include "comm/comm.h"
#include "factory/factory.h"

namespace seam_suite {

INSTANTIATE_TEST_SUITE_P(Gpu, Seam, ::testing::Values(Device::CUDA),
                         [](const ::testing::TestParamInfo<Device>& i) { return std::string(device_name(i.param)); });
CM_SEAM_FIXTURE_SUITES(Gpu, ::testing::Values(Device::CUDA));

}  // namespace seam_suite

namespace {

using namespace cm;

// The default model (NVFP4 linears, routed experts through the packed FP4 MoE
// kernels, which no golden fixture's shape takes): the GPU's logits against
// the CPU backend's (95% of rows within 3% of max|logit|, argmax agreement >= 95%), and chunked
// decode on the GPU equal to its own one-step prefill bit for bit.
TEST(SeamCudaDefaultModel, MatchesCpuAndChunkingIsBitExact) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  auto m = model_load(seam_suite::kData + "/../../models/default");
  const int64_t V = m->config.vocab_size, T = 45;
  std::vector<int32_t> toks(static_cast<size_t>(T));
  std::mt19937 rng(3);
  for (int32_t& t : toks) t = int32_t(rng() % uint32_t(V));
  std::vector<float> cpu = test::cpu_logits(*m, toks, 0);
  auto be = test::reserved_backend(*m, Device::CUDA, 2, int32_t(T), 256);
  std::printf("  default model: %zu bytes of device state per slot at a 4096-token context\n",
              be->bytes_per_slot(CacheShape{1, 1, 4096}));
  std::vector<float> whole = test::feed_chunks(*be, 0, toks.data(), T, 0, V);
  std::vector<float> chunked = test::feed_chunks(*be, 1, toks.data(), T, 7, V);
  const seam_suite::RowAgreement ra = seam_suite::row_agreement(whole, cpu, V);
  const double d = ra.max_d, amax = ra.amax;
  const int64_t agree = ra.agree, close = ra.close, worst = ra.worst;
  std::printf("  default model: max |cuda - cpu| = %.3g (%.2f%% of max |logit| %.3g, row %lld), rows within 3%%: "
              "%lld/%lld, argmax agreement %lld/%lld\n",
              d, 100.0 * d / amax, amax, (long long)worst, (long long)close, (long long)T, (long long)agree,
              (long long)T);
  // bf16 activations: a row can flip a discrete choice near a tie (router or indexer top-k) and then
  // differ by more than 3% (any change of the GPU's summation order moves which rows do), so the bound
  // is per row, as for the golden fixtures: 95% of rows within 3% of max|logit|, argmax >= 95%.
  EXPECT_GE(double(close), 0.95 * double(T));
  EXPECT_GE(double(agree), 0.95 * double(T));
  EXPECT_EQ(std::memcmp(whole.data(), chunked.data(), whole.size() * 4), 0)
      << "chunks of 7 differ from one prefill (max |Δ| " << seam_suite::max_abs(whole, chunked) << ")";
}

}  // namespace

namespace {

using namespace cm;

// CUDA graphs: the same steps replayed from captured graphs give the eager launches' bits — a
// 20-token prefill, then decode steps of three slots (a shape captured once and replayed), with
// steps where only some rows want logits and one where none does; then a step wider than the
// graph limit (eager in both) and the same decode shape again after it.
TEST(CudaGraphs, ReplayGivesTheEagerBits) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  auto m = model_load(seam_suite::kData + "/../../models/default");
  const int64_t V = m->config.vocab_size;
  BackendOptions eager_opt;
  eager_opt.cuda_graphs = false;
  auto graph = test::reserved_backend(*m, Device::CUDA, 3, 300, 512);
  auto eager = test::reserved_backend(*m, Device::CUDA, 3, 300, 512, eager_opt);
  std::mt19937 rng(11);
  const auto tok = [&] { return int32_t(rng() % uint32_t(V)); };
  std::vector<int32_t> pos(3, 0);
  int steps = 0;
  const auto run = [&](const std::vector<int32_t>& slots, const std::vector<uint8_t>& want, int64_t per_slot) {
    std::vector<int32_t> t, p, s;
    std::vector<uint8_t> w;
    for (size_t i = 0; i < slots.size(); ++i)
      for (int64_t k = 0; k < per_slot; ++k) {
        t.push_back(tok());
        p.push_back(pos[size_t(slots[i])]++);
        s.push_back(slots[i]);
        w.push_back(k + 1 == per_slot ? want[i] : 0);
      }
    const int64_t n = int64_t(t.size());
    std::vector<float> a(size_t(n * V), 0.f), b(size_t(n * V), 0.f);
    const Batch batch{int32_t(n), t.data(), p.data(), s.data(), w.data()};
    graph->step(batch, a.data());
    eager->step(batch, b.data());
    ++steps;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0)
        << "step " << steps << " (" << n << " rows): graph and eager logits differ, max |Δ| "
        << seam_suite::max_abs(a, b);
  };
  run({0}, {1}, 20);                                // prefill of slot 0
  run({1, 2}, {1, 1}, 5);                           // prefill of slots 1 and 2
  for (int i = 0; i < 6; ++i) run({0, 1, 2}, {1, 1, 1}, 1);  // decode, the same shape replayed
  run({0, 1, 2}, {1, 0, 1}, 1);                     // two of three rows want logits
  run({0, 1, 2}, {0, 0, 0}, 1);                     // none does
  run({0}, {1}, 290);                               // wider than the graph limit: eager in both
  for (int i = 0; i < 3; ++i) run({0, 1, 2}, {1, 1, 1}, 1);
}

}  // namespace

namespace {

using namespace cm;

// --fast-prefill (BackendOptions::batch_invariant = false): a 400-token prompt in one step takes the
// cuBLAS path for the default model's NVFP4 linears (more than 256 rows). Its logits differ from the
// batch-invariant step's (another summation order: the option must change the path) and stay as close
// to the CPU backend as the batch-invariant path's do (95% of rows within 3%, argmax >= 95%). Steps of
// 256 rows or fewer are unchanged: the same prompt in chunks of 100 gives the batch-invariant bits.
TEST(CudaFastPrefill, LongStepsUseCublasAndStayCloseToTheCpu) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  auto m = model_load(seam_suite::kData + "/../../models/default");
  const int64_t V = m->config.vocab_size, T = 400;
  ASSERT_GE(m->config.max_position_embeddings, T);
  std::vector<int32_t> toks(static_cast<size_t>(T));
  std::mt19937 rng(21);
  for (int32_t& t : toks) t = int32_t(rng() % uint32_t(V));
  const std::vector<float> cpu = test::cpu_logits(*m, toks, 0);
  BackendOptions fast_opt;
  fast_opt.batch_invariant = false;
  auto exact = test::reserved_backend(*m, Device::CUDA, 2, int32_t(T), T);
  auto fast = test::reserved_backend(*m, Device::CUDA, 2, int32_t(T), T, fast_opt);
  const std::vector<float> e = test::feed_chunks(*exact, 0, toks.data(), T, 0, V);
  const std::vector<float> f = test::feed_chunks(*fast, 0, toks.data(), T, 0, V);
  const seam_suite::RowAgreement re = seam_suite::row_agreement(e, cpu, V), rf = seam_suite::row_agreement(f, cpu, V);
  std::printf("  %lld-token step vs cpu: batch-invariant max|d| %.2f%% of max|logit|, rows within 3%% %lld, argmax "
              "%lld; fast %.2f%%, %lld, %lld; fast vs batch-invariant max|d| %.3g\n",
              (long long)T, 100.0 * re.max_d / re.amax, (long long)re.close, (long long)re.agree,
              100.0 * rf.max_d / rf.amax, (long long)rf.close, (long long)rf.agree, seam_suite::max_abs(f, e));
  EXPECT_NE(std::memcmp(e.data(), f.data(), e.size() * 4), 0) << "--fast-prefill changed nothing";
  for (const seam_suite::RowAgreement* r : {&re, &rf}) {
    EXPECT_GE(double(r->close), 0.95 * double(T));
    EXPECT_GE(double(r->agree), 0.95 * double(T));
  }
  const std::vector<float> fc = test::feed_chunks(*fast, 1, toks.data(), T, 100, V);
  const std::vector<float> ec = test::feed_chunks(*exact, 1, toks.data(), T, 100, V);
  EXPECT_EQ(std::memcmp(fc.data(), ec.data(), fc.size() * 4), 0) << "steps of 100 rows differ under --fast-prefill";
  EXPECT_EQ(std::memcmp(ec.data(), e.data(), ec.size() * 4), 0) << "the batch-invariant path is not chunk-invariant";
}

}  // namespace

namespace {

using namespace cm;

// Expert parallelism needs a device communicator (test_ep_cuda.cpp runs it), and a model must hold
// the routed experts its rank runs: a host Comm of two ranks, or a one-rank backend over a model
// loaded with one expert, is refused by name instead of running as if it held all.
TEST(CudaBackendRefuses, ExpertParallelismWithoutItsPieces) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  const std::string dir = seam_suite::kData + "/golden/hf_text";
  auto whole = model_load(dir);
  auto comms = make_thread_comms(2, 5);
  BackendOptions ep;
  ep.ep_comm = comms[0].get();
  try {
    make_backend(*whole, Device::CUDA, ep);
    ADD_FAILURE() << "a 2-rank ep_comm was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert parallelism over 2 ranks"), std::string::npos) << e.what();
  }
  LoadOptions lo;
  lo.experts = ExpertRange{0, 1};
  auto part = model_load(dir, lo);
  try {
    make_backend(*part, Device::CUDA);
    ADD_FAILURE() << "a model holding one routed expert was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the model holds [0, 1)"), std::string::npos) << e.what();
  }
}

// The FP8 KV cache runs on the CPU backend only for now: the CUDA backend says so rather than run bf16.
TEST(CudaBackendRefuses, Fp8KvCacheItDoesNotRun) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  auto m = model_load(seam_suite::kData + "/golden/hf_text");
  BackendOptions o;
  o.kv_cache = KvCache::FP8;
  try {
    make_backend(*m, Device::CUDA, o);
    ADD_FAILURE() << "--kv-cache-dtype fp8 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype fp8 is not built for the CUDA backend"), std::string::npos)
        << e.what();
  }
}

}  // namespace
