// DeviceComm (comm_device.h): R in-process ranks on one GPU.
#include "backend/cuda/comm/comm_device.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cuda/core/cuda_errors.h"
#include "backend/cuda/core/cuda_util.h"

namespace cm {

namespace {

// Shared by every rank (device memory, zeroed once): arrival epochs, each rank's epoch counter
// (written only by that rank's stream) and the published buffer addresses.
struct Board {
  unsigned long long* arrived;  // [R]
  unsigned long long* epoch;    // [R]
  void** bufs;                  // [R]
};

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// One thread: publish (optionally) this rank's buffer, arrive, wait for every rank.
__global__ void barrier_kernel(Board b, int rank, int R, void* buf, unsigned long long timeout_ns) {
  if (threadIdx.x != 0) return;
  const unsigned long long e = b.epoch[rank] + 1;
  b.epoch[rank] = e;
  if (buf) b.bufs[rank] = buf;
  __threadfence();
  store_release(&b.arrived[rank], e);
  const unsigned long long t0 = global_ns();
  for (int q = 0; q < R; ++q)
    while (load_acquire(&b.arrived[q]) < e)
      if (global_ns() - t0 > timeout_ns) {
        printf("DeviceComm rank %d: rank %d did not arrive at collective barrier %llu within the timeout\n", rank, q,
               e);
        __trap();
      }
  __threadfence();
}

template <typename T>
__global__ void reduce_chunk_kernel(Board b, int rank, int R, int64_t n) {
  const int64_t lo = int64_t(rank) * n / R, hi = int64_t(rank + 1) * n / R;
  T* mine = static_cast<T*>(b.bufs[rank]);
  for (int64_t i = lo + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < hi; i += int64_t(gridDim.x) * blockDim.x) {
    T s = __ldcg(static_cast<const T*>(b.bufs[0]) + i);
    for (int q = 1; q < R; ++q) s += __ldcg(static_cast<const T*>(b.bufs[q]) + i);
    mine[i] = s;
  }
}

template <typename T>
__global__ void gather_chunks_kernel(Board b, int rank, int R, int64_t n) {
  T* mine = static_cast<T*>(b.bufs[rank]);
  for (int q = 0; q < R; ++q) {
    if (q == rank) continue;
    const int64_t lo = int64_t(q) * n / R, hi = int64_t(q + 1) * n / R;
    const T* src = static_cast<const T*>(b.bufs[q]);
    for (int64_t i = lo + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < hi;
         i += int64_t(gridDim.x) * blockDim.x)
      mine[i] = __ldcg(src + i);
  }
}

struct Shared {
  explicit Shared(int r) : ranks(r) {
    mem.alloc(size_t(r) * 24);
    mem.zero();
    board.arrived = mem.as<unsigned long long>();
    board.epoch = board.arrived + r;
    board.bufs = reinterpret_cast<void**>(board.epoch + r);
  }
  int ranks;
  cuda::DeviceBuffer mem;
  Board board{};
};

class DeviceComm final : public Comm {
 public:
  DeviceComm(std::shared_ptr<Shared> s, std::unique_ptr<Comm> host, double timeout_s)
      : s_(std::move(s)), host_(std::move(host)), timeout_ns_(static_cast<unsigned long long>(timeout_s * 1e9)) {}
  ~DeviceComm() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  void barrier() override { host_->barrier(); }

  bool stream_ordered() const override { return true; }
  void all_reduce_sum_on(void* stream, void* buf, int64_t n, CommType t) override {
    CM_CU_CHECK(n >= 0 && (n == 0 || buf), "DeviceComm rank %d: all_reduce_sum_on of %lld elements at %p", rank(),
                (long long)n, buf);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const int r = rank(), R = size();
    const unsigned blocks = unsigned(std::min<int64_t>(64, std::max<int64_t>(1, (n / R + 255) / 256)));
    barrier_kernel<<<1, 32, 0, st>>>(s_->board, r, R, buf, timeout_ns_);
    CM_CUDA_LAUNCH("DeviceComm barrier_kernel");
    if (t == CommType::F32)
      reduce_then_gather<float>(st, r, R, n, blocks);
    else
      reduce_then_gather<int32_t>(st, r, R, n, blocks);
  }

  // Host-synchronous collectives: device (or host) buffers staged through host memory.
  void all_reduce_sum(void* buf, int64_t n, CommType t) override {
    stage_in(a_, buf, n);
    host_->all_reduce_sum(a_.data(), n, t);
    stage_out(buf, a_, n);
  }
  void all_gather(const void* send, int64_t n, void* recv, CommType t) override {
    stage_in(a_, send, n);
    b_.resize(size_t(n) * size_t(size()));
    host_->all_gather(a_.data(), n, b_.data(), t);
    stage_out(recv, b_, n * size());
  }
  void all_gatherv(const void* send, const int64_t* counts, void* recv, CommType t) override {
    int64_t total = 0;
    for (int q = 0; q < size(); ++q) total += counts[q];
    stage_in(a_, send, counts[rank()]);
    b_.resize(size_t(total));
    host_->all_gatherv(a_.data(), counts, b_.data(), t);
    stage_out(recv, b_, total);
  }
  void reduce_scatter_sum(const void* send, int64_t n, void* recv, CommType t) override {
    stage_in(a_, send, n * size());
    b_.resize(size_t(n));
    host_->reduce_scatter_sum(a_.data(), n, b_.data(), t);
    stage_out(recv, b_, n);
  }
  void all_to_allv(const void* send, const int64_t* sc, void* recv, const int64_t* rc, CommType t) override {
    int64_t ns = 0, nr = 0;
    for (int q = 0; q < size(); ++q) ns += sc[q], nr += rc[q];
    stage_in(a_, send, ns);
    b_.resize(size_t(nr));
    host_->all_to_allv(a_.data(), sc, b_.data(), rc, t);
    stage_out(recv, b_, nr);
  }

 private:
  // reduce, barrier, gather, barrier (the first barrier, which publishes buf, is the caller's).
  template <typename T>
  void reduce_then_gather(cudaStream_t st, int r, int R, int64_t n, unsigned blocks) {
    reduce_chunk_kernel<T><<<blocks, 256, 0, st>>>(s_->board, r, R, n);
    CM_CUDA_LAUNCH("DeviceComm reduce_chunk_kernel");
    barrier_kernel<<<1, 32, 0, st>>>(s_->board, r, R, nullptr, timeout_ns_);
    CM_CUDA_LAUNCH("DeviceComm barrier_kernel");
    gather_chunks_kernel<T><<<blocks, 256, 0, st>>>(s_->board, r, R, n);
    CM_CUDA_LAUNCH("DeviceComm gather_chunks_kernel");
    barrier_kernel<<<1, 32, 0, st>>>(s_->board, r, R, nullptr, timeout_ns_);
    CM_CUDA_LAUNCH("DeviceComm barrier_kernel");
  }
  // Every element type is 4 bytes (comm_type_bytes). Host buffers (the LeaderBackend's messages) are
  // copied by the CPU; device ones on this communicator's own non-blocking stream. Neither touches
  // the legacy default stream, which would wait for every rank's stream, including one spinning in a
  // stream-ordered collective for this very rank.
  void stage_in(std::vector<uint32_t>& h, const void* src, int64_t n) {
    h.resize(size_t(std::max<int64_t>(n, 1)));
    copy(h.data(), src, n);
  }
  void stage_out(void* dst, const std::vector<uint32_t>& h, int64_t n) { copy(dst, h.data(), n); }
  void copy(void* dst, const void* src, int64_t n) {
    if (n <= 0) return;
    if (!cuda::is_device_pointer(dst) && !cuda::is_device_pointer(src)) {
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    }
    if (!stream_) CM_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CM_CUDA(cudaMemcpyAsync(dst, src, size_t(n) * 4, cudaMemcpyDefault, stream_));
    CM_CUDA(cudaStreamSynchronize(stream_));
  }
  std::shared_ptr<Shared> s_;
  std::unique_ptr<Comm> host_;
  unsigned long long timeout_ns_;
  std::vector<uint32_t> a_, b_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::vector<std::unique_ptr<Comm>> make_device_comms(int ranks, double timeout_s) {
  CM_CU_CHECK(ranks >= 1 && ranks <= 64, "make_device_comms: %d ranks (1 to 64)", ranks);
  // Under lazy module loading (the CUDA default) a kernel's first launch may wait for the whole
  // context, which never drains while another rank's barrier spins for this one: any kernel of the
  // step, not only ours, so two or more ranks in one process need every module loaded up front
  // (eager loading loads this file's kernels too).
  if (ranks > 1) {
    CM_CUDA(cudaFree(nullptr));  // the context, so that the loading mode is the one in force
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CM_CUDA(cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &fn, 12000, cudaEnableDefault, &q));
    CM_CU_CHECK(q == cudaDriverEntryPointSuccess && fn, "make_device_comms: the driver has no cuModuleGetLoadingMode");
    CUmoduleLoadingMode mode{};
    CM_CU_CHECK(reinterpret_cast<CUresult (*)(CUmoduleLoadingMode*)>(fn)(&mode) == CUDA_SUCCESS,
                "make_device_comms: cuModuleGetLoadingMode failed");
    CM_CU_CHECK(mode == CU_MODULE_EAGER_LOADING,
                "make_device_comms: %d in-process ranks on one GPU need CUDA_MODULE_LOADING=EAGER in the environment "
                "before the process first uses CUDA (under lazy loading a rank's first launch of a kernel can wait for "
                "another rank's collective, which waits for it)",
                ranks);
  }
  auto shared = std::make_shared<Shared>(ranks);
  std::vector<std::unique_ptr<Comm>> host = make_thread_comms(ranks, timeout_s);
  std::vector<std::unique_ptr<Comm>> out;
  for (int r = 0; r < ranks; ++r)
    out.push_back(std::make_unique<DeviceComm>(shared, std::move(host[size_t(r)]), timeout_s));
  return out;
}

}  // namespace cm
