// NcclComm with one rank on one GPU (the lent single GPU): every collective
// moves/sums device buffers exactly, and a second communicator can be made
// after the first is gone (the second round failed while the destructor did not wait for
// ncclCommFinalize); host buffers are staged; the stream-ordered all-reduce runs eager and from a
// CUDA graph. Multi-rank NCCL needs a multi-GPU machine.
#include <gtest/gtest.h>

#ifdef CLAWMINE_HAVE_NCCL
#include <cuda_runtime.h>

#include <vector>

#include "backend/cuda/comm/comm_nccl.h"
#include "common/error.h"
#include "gpu_test_util.h"

using namespace cm;

namespace {

template <typename T>
struct Dev {
  T* p = nullptr;
  explicit Dev(const std::vector<T>& h) {
    EXPECT_EQ(cudaMalloc(&p, h.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get(size_t n) const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

TEST(NcclComm, OneRankCollectives) {
  CM_SKIP_WITHOUT_GPU();
  for (int round = 0; round < 2; ++round) {
    // Round 1 makes a second communicator after the first was finalized and destroyed.
    std::unique_ptr<Comm> c = make_nccl_comm(0, 1, nccl_unique_id());
    EXPECT_EQ(c->rank(), 0);
    EXPECT_EQ(c->size(), 1);
    std::vector<float> h = {1.5f, -2.0f, 3.25f};
    Dev<float> a(h), b(std::vector<float>(3, 0.0f));
    c->all_reduce_sum(a.p, 3);
    EXPECT_EQ(a.get(3), h);
    c->all_gather(a.p, 3, b.p);
    EXPECT_EQ(b.get(3), h);
    int64_t n = 3;
    Dev<float> g(std::vector<float>(3, 0.0f));
    c->all_gatherv(a.p, &n, g.p);
    EXPECT_EQ(g.get(3), h);
    Dev<int32_t> s(std::vector<int32_t>{7, 8}), r(std::vector<int32_t>{0, 0});
    c->reduce_scatter_sum(s.p, 2, r.p);
    EXPECT_EQ(r.get(2), (std::vector<int32_t>{7, 8}));
    Dev<int32_t> r2(std::vector<int32_t>{0, 0});
    int64_t two = 2;
    c->all_to_allv(s.p, &two, r2.p, &two);
    EXPECT_EQ(r2.get(2), (std::vector<int32_t>{7, 8}));
    // Host buffers (the LeaderBackend's messages) are staged through the device.
    std::vector<int32_t> hs = {4, 5, 6}, hr(3, 0);
    int64_t three = 3;
    c->all_gatherv(hs.data(), &three, hr.data(), CommType::I32);
    EXPECT_EQ(hr, hs);
    std::vector<float> hf = {0.5f, 7.0f};
    c->all_reduce_sum(hf.data(), 2);
    EXPECT_EQ(hf, (std::vector<float>{0.5f, 7.0f}));
    // Stream-ordered (the CUDA backend's expert exchange), eager and captured in a graph.
    EXPECT_TRUE(c->stream_ordered());
    cudaStream_t st;
    ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    c->all_reduce_sum_on(st, a.p, 3, CommType::F32);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(a.get(3), h);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t ge = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    c->all_reduce_sum_on(st, a.p, 3, CommType::F32);
    ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&ge, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(ge, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(a.get(3), h);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
    c->barrier();
  }
}

TEST(NcclComm, BadUniqueIdIsAnError) {
  CM_SKIP_WITHOUT_GPU();
  EXPECT_THROW(make_nccl_comm(0, 1, "short"), Error);
  EXPECT_THROW(make_nccl_comm(2, 2, nccl_unique_id()), Error);
}

}  // namespace
#endif
