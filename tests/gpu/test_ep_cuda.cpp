// Expert parallelism inside the CUDA backend, proven on one GPU: R in-process ranks (DeviceComm, one
// thread and one CudaBackend each, every rank uploading only its share of the routed experts) give
// the logits of one CUDA rank holding every expert, bit for bit, on every golden fixture and the
// default model (packed NVFP4/MXFP4 experts and per-expert linears), as one prefill, in chunks of 1
// and 7 (graphed decode steps) and in a mixed batch of three sequences, for R = 2, 3 and 4; rank 0
// drives the others through LeaderBackend as the server would. Also: the device all-reduce itself
// (eager and replayed from a graph, sums in rank order), and one NCCL rank running the same path.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <random>
#include <thread>

#include "backend/cuda/comm/comm_device.h"
#include "backend/cuda/cuda_backend.h"
#include "common/error.h"
#include "comm/comm.h"
#include "factory/factory.h"
#include "factory/leader_backend.h"
#include "gpu_test_util.h"
#include "model/model.h"
#include "../step_util.h"
#ifdef CLAWMINE_HAVE_NCCL
#include "backend/cuda/comm/comm_nccl.h"
#endif

using namespace cm;

namespace {

const std::string kData = CLAWMINE_TEST_DATA;

// In-process ranks need every module loaded when the context is made (make_device_comms refuses
// lazy loading, which can deadlock ranks spinning for each other); set before main, so before the
// binary's first CUDA call, unless the environment already says otherwise.
const bool kEagerModules = [] {
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  return true;
}();

// R ranks over one whole model: rank 0's backend behind a LeaderBackend (lead), the others in
// run_follower on their own threads. Every rank's CudaBackend uploads only its experts.
class EpGroup {
 public:
  EpGroup(const Model& m, int R, double timeout_s = 60) : comms_(make_device_comms(R, timeout_s)) {
    for (int r = 1; r < R; ++r)
      threads_.emplace_back([this, &m, r] {
        try {
          BackendOptions opt;
          opt.ep_comm = comms_[size_t(r)].get();
          std::unique_ptr<ModelBackend> be = make_cuda_backend(m, opt);
          run_follower(*be, *comms_[size_t(r)], m.config.vocab_size);
        } catch (...) {
          std::lock_guard<std::mutex> lk(mu_);
          if (!err_) err_ = std::current_exception();
        }
      });
    BackendOptions opt;
    opt.ep_comm = comms_[0].get();
    local_ = make_cuda_backend(m, opt);
    lead_ = std::make_unique<LeaderBackend>(*local_, *comms_[0]);
  }
  ~EpGroup() { finish(); }
  ModelBackend& backend() { return *lead_; }
  // Ends the followers; rethrows the first error a follower met.
  void finish() {
    lead_.reset();
    for (auto& t : threads_) t.join();
    threads_.clear();
    if (err_) std::rethrow_exception(std::exchange(err_, nullptr));
  }

 private:
  std::vector<std::unique_ptr<Comm>> comms_;
  std::vector<std::thread> threads_;
  std::unique_ptr<ModelBackend> local_;
  std::unique_ptr<LeaderBackend> lead_;
  std::mutex mu_;
  std::exception_ptr err_;
};

void expect_bits(const std::vector<float>& got, const std::vector<float>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &ref[i], 4) != 0 && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " logits differ, first at " << first << " ("
                     << got[first] << " vs " << ref[first] << ")";
}

// The script every backend runs: the tokens as one prefill, in chunks of 1 and of 7 (each in a fresh
// slot), then a mixed batch: slot 3 prefills 5 tokens while slots 0 and 1 decode one each.
std::vector<float> script(ModelBackend& be, const std::vector<int32_t>& toks, int64_t V) {
  const int64_t n = int64_t(toks.size());
  be.reserve(CacheShape{4, int32_t(n), n + 8});
  std::vector<float> all;
  for (int32_t s = 0; s < 3; ++s) {
    const std::vector<float> l = test::feed_chunks(be, s, toks.data(), n, s == 0 ? 0 : s == 1 ? 1 : 7, V);
    all.insert(all.end(), l.begin(), l.end());
  }
  std::vector<int32_t> t = {toks[1], toks[2], toks[0], toks[3], toks[4], toks[5], toks[6]};
  std::vector<int32_t> p = {int32_t(n), int32_t(n), 0, 1, 2, 3, 4};
  std::vector<int32_t> sl = {0, 1, 3, 3, 3, 3, 3};
  std::vector<uint8_t> want(t.size(), 1);
  std::vector<float> out(t.size() * size_t(V));
  be.step(Batch{int32_t(t.size()), t.data(), p.data(), sl.data(), want.data()}, out.data());
  all.insert(all.end(), out.begin(), out.end());
  for (int k = 0; k < 3; ++k) {  // three graphed two-slot decode steps
    std::vector<int32_t> t2 = {toks[size_t(k + 3)], toks[size_t(k + 7)]}, p2 = {int32_t(n + 1 + k), int32_t(5 + k)},
                         s2 = {0, 3};
    std::vector<uint8_t> w2(2, 1);
    std::vector<float> o2(2 * size_t(V));
    be.step(Batch{2, t2.data(), p2.data(), s2.data(), w2.data()}, o2.data());
    all.insert(all.end(), o2.begin(), o2.end());
  }
  return all;
}

std::vector<int32_t> tokens_for(const Model& m, const std::string& dir) {
  if (dir.find("golden") != std::string::npos) {
    std::vector<int32_t> t = test::read_expected(dir).tokens;
    if (t.size() > 40) t.resize(40);
    if (t.size() >= 12) return t;
  }
  std::vector<int32_t> t(37);
  std::mt19937 rng(7);
  for (int32_t& x : t) x = int32_t(rng() % uint32_t(m.config.vocab_size));
  return t;
}

class EpCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(EpCuda, RanksGiveOneRanksBits) {
  CM_SKIP_WITHOUT_GPU();
  const std::string dir = kData + "/" + GetParam();
  auto m = model_load(dir);
  const int64_t V = m->config.vocab_size;
  const std::vector<int32_t> toks = tokens_for(*m, dir);
  std::vector<float> ref;
  {
    // One rank first: every kernel of the step is loaded before ranks spin on each other.
    std::unique_ptr<ModelBackend> one = make_cuda_backend(*m, BackendOptions{});
    ref = script(*one, toks, V);
  }
  for (int R : {2, 3, 4}) {
    if (R > m->config.n_routed_experts) continue;
    std::vector<float> got;
    {
      EpGroup g(*m, R);
      got = script(g.backend(), toks, V);
      g.finish();
    }
    expect_bits(got, ref, GetParam() + " R=" + std::to_string(R));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EpCuda,
                         ::testing::Values("golden/hf_mixed_yarn", "golden/release_real_ratios", "golden/hf_hca_window",
                                           "golden/hf_text", "golden_quant_nvfp4", "golden_quant_release",
                                           "../../models/default"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::string o;
                           for (char ch : s)
                             if (std::isalnum(static_cast<unsigned char>(ch))) o += ch;
                           return o;
                         });

// The device all-reduce: R ranks, each on its own stream, eager then captured once and replayed
// three times; every element is the rank-order float sum of the ranks' values.
TEST(DeviceComm, AllReduceInRankOrderEagerAndGraphed) {
  CM_SKIP_WITHOUT_GPU();
  for (int R : {1, 2, 3, 4}) {
    auto comms = make_device_comms(R, 30);
    const int64_t n = 100003;  // not a multiple of R: uneven chunks
    std::vector<std::vector<float>> host(static_cast<size_t>(R), std::vector<float>(static_cast<size_t>(n)));
    std::mt19937 rng(static_cast<uint32_t>(R));
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& h : host)
      for (float& x : h) x = nd(rng) * 1e3f;
    std::vector<float> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float s = host[0][size_t(i)];
      for (int r = 1; r < R; ++r) s += host[size_t(r)][size_t(i)];
      want[size_t(i)] = s;
    }
    std::vector<std::exception_ptr> err(static_cast<size_t>(R));
    std::vector<std::vector<float>> got(static_cast<size_t>(R) * 2);
    std::vector<std::thread> th;
    for (int r = 0; r < R; ++r)
      th.emplace_back([&, r] {
        try {
          cudaStream_t st;
          CM_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
          float* d = nullptr;
          CM_CUDA(cudaMalloc(&d, size_t(n) * 4));
          const size_t bytes = size_t(n) * 4;
          CM_CUDA(cudaMemcpyAsync(d, host[size_t(r)].data(), bytes, cudaMemcpyHostToDevice, st));
          comms[size_t(r)]->all_reduce_sum_on(st, d, n, CommType::F32);
          got[size_t(2 * r)].resize(size_t(n));
          CM_CUDA(cudaMemcpyAsync(got[size_t(2 * r)].data(), d, bytes, cudaMemcpyDeviceToHost, st));
          CM_CUDA(cudaStreamSynchronize(st));
          // A graph of (upload, all-reduce), replayed: the epochs live on the device and keep counting.
          cudaGraph_t g;
          cudaGraphExec_t ge;
          CM_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
          CM_CUDA(cudaMemcpyAsync(d, host[size_t(r)].data(), bytes, cudaMemcpyHostToDevice, st));
          comms[size_t(r)]->all_reduce_sum_on(st, d, n, CommType::F32);
          CM_CUDA(cudaStreamEndCapture(st, &g));
          CM_CUDA(cudaGraphInstantiate(&ge, g, 0));
          for (int k = 0; k < 3; ++k) CM_CUDA(cudaGraphLaunch(ge, st));
          got[size_t(2 * r + 1)].resize(size_t(n));
          CM_CUDA(cudaMemcpyAsync(got[size_t(2 * r + 1)].data(), d, bytes, cudaMemcpyDeviceToHost, st));
          CM_CUDA(cudaStreamSynchronize(st));
          cudaGraphExecDestroy(ge);
          cudaGraphDestroy(g);
          cudaFree(d);
          cudaStreamDestroy(st);
        } catch (...) {
          err[size_t(r)] = std::current_exception();
        }
      });
    for (auto& t : th) t.join();
    for (auto& e : err)
      if (e) std::rethrow_exception(e);
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < 2; ++k)
        EXPECT_EQ(std::memcmp(got[size_t(2 * r + k)].data(), want.data(), size_t(n) * 4), 0)
            << "R=" << R << " rank " << r << (k ? " graphed" : " eager");
  }
}

// A host communicator cannot carry the CUDA backend's exchange: refused by name.
TEST(EpCudaRefuses, HostCommunicatorAndMissingExperts) {
  CM_SKIP_WITHOUT_GPU();
  const std::string dir = kData + "/golden_quant_nvfp4";
  auto whole = model_load(dir);
  auto comms = make_thread_comms(2, 5);
  BackendOptions ep;
  ep.ep_comm = comms[0].get();
  try {
    make_cuda_backend(*whole, ep);
    ADD_FAILURE() << "a host communicator was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a device communicator"), std::string::npos) << e.what();
  }
  LoadOptions lo;
  lo.experts = ExpertRange{0, 1};
  auto part = model_load(dir, lo);
  auto dev = make_device_comms(2, 5);
  BackendOptions ep1;
  ep1.ep_comm = dev[1].get();  // rank 1 of 2 runs the upper half; the model holds expert 0 only
  try {
    make_cuda_backend(*part, ep1);
    ADD_FAILURE() << "rank 1 was built over a model without its experts";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 of 2 runs routed experts"), std::string::npos) << e.what();
  }
}

#ifdef CLAWMINE_HAVE_NCCL
// One NCCL rank through the same exchange path (the all-reduce enqueued on the backend's stream and
// captured in its graphs): the bits of the backend without a communicator.
TEST(EpCuda, OneNcclRankRunsTheExchangePath) {
  CM_SKIP_WITHOUT_GPU();
  auto m = model_load(kData + "/golden_quant_nvfp4");
  const std::vector<int32_t> toks = tokens_for(*m, kData + "/golden_quant_nvfp4");
  std::vector<float> ref;
  {
    std::unique_ptr<ModelBackend> one = make_cuda_backend(*m, BackendOptions{});
    ref = script(*one, toks, m->config.vocab_size);
  }
  std::unique_ptr<Comm> c = make_nccl_comm(0, 1, nccl_unique_id());
  BackendOptions opt;
  opt.ep_comm = c.get();
  std::unique_ptr<ModelBackend> be = make_cuda_backend(*m, opt);
  expect_bits(script(*be, toks, m->config.vocab_size), ref, "one NCCL rank");
}
#endif

}  // namespace
