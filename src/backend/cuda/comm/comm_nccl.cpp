// NcclComm (comm_nccl.h). The communicator is non-blocking (config.blocking = 0)
// so that neither init nor an enqueue can block forever inside NCCL: every call
// returns ncclSuccess or ncclInProgress and wait() polls ncclCommGetAsyncError
// and the stream with a deadline, aborting the communicator on error or timeout.
#ifdef CLAWMINE_HAVE_NCCL
#include "backend/cuda/comm/comm_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "backend/cuda/core/cuda_util.h"
#include "common/error.h"

namespace cm {

namespace {

ncclDataType_t nccl_type(CommType t) { return t == CommType::F32 ? ncclFloat32 : ncclInt32; }

class NcclComm final : public Comm {
 public:
  NcclComm(int rank, int size, const std::string& id, const NcclOptions& opt) : rank_(rank), size_(size), opt_(opt) {
    if (id.size() != sizeof(ncclUniqueId))
      fail("NCCL rank {}: unique id of {} bytes, expected {}", rank, id.size(), sizeof(ncclUniqueId));
    if (size < 1 || rank < 0 || rank >= size) fail("NCCL: rank {} outside [0, {})", rank, size);
    // An older library than the headers misreads the config struct and the
    // collectives' arguments (seen: "AllReduce: invalid root 0" with a one-rank
    // communicator); refuse it by name instead.
    int lib = 0;
    if (ncclGetVersion(&lib) != ncclSuccess || lib / 100 < NCCL_VERSION_CODE / 100)
      fail("NCCL: the loaded library is version {}.{} but clawmine was built with the {}.{} headers; "
           "build against the library that is loaded at run time (or put the newer one first on the library path)",
           lib / 10000, lib / 100 % 100, NCCL_VERSION_CODE / 10000, NCCL_VERSION_CODE / 100 % 100);
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof uid);
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaMalloc(&scratch_, sizeof(int32_t)), "cudaMalloc");
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, size, uid, rank, &cfg), "ncclCommInitRankConfig");
    wait("init", false);
    int n = 0;
    if (ncclCommCount(comm_, &n) != ncclSuccess || n != size)
      die("init", fmt::format("the communicator reports {} of {} ranks", n, size));
  }
  ~NcclComm() override {
    if (comm_ && !aborted_) {
      // A non-blocking ncclCommFinalize returns ncclInProgress while it flushes: wait for it before
      // ncclCommDestroy. Destroying a communicator whose finalize is still in progress fails inside
      // NCCL 2.28 after it has opened a group it never closes, and the process's next communicator
      // is then set up inside that group and comes up with no ranks.
      ncclResult_t r = ncclCommFinalize(comm_);
      ncclResult_t st = r;
      const auto t0 = std::chrono::steady_clock::now();
      while ((r == ncclSuccess || r == ncclInProgress) && st == ncclInProgress &&
             std::chrono::steady_clock::now() - t0 < std::chrono::duration<double>(opt_.timeout_s)) {
        if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) st = ncclInternalError;
        if (st == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (st == ncclSuccess)
        (void)ncclCommDestroy(comm_);
      else
        (void)ncclCommAbort(comm_);  // a finalize that failed or never finished
    }
    if (scratch_) cudaFree(scratch_);
    if (stage_) cudaFree(stage_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void barrier() override {
    check(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), "barrier");
    wait("barrier");
  }
  bool stream_ordered() const override { return true; }
  void all_reduce_sum_on(void* stream, void* buf, int64_t n, CommType t) override {
    // Enqueued only (ncclSuccess or, non-blocking, ncclInProgress): the caller's stream orders it.
    check(ncclAllReduce(buf, buf, size_t(n), nccl_type(t), ncclSum, comm_, static_cast<cudaStream_t>(stream)),
          "all_reduce_sum_on");
  }
  // The host-synchronous collectives take device or host buffers (the LeaderBackend's messages are
  // host memory): NCCL moves device memory only, so host ones are staged through device scratch.
  void all_reduce_sum(void* buf, int64_t n, CommType t) override {
    staged(buf, n, buf, n, "all_reduce_sum", [&](const void* s, void* r) {
      check(ncclAllReduce(s, r, size_t(n), nccl_type(t), ncclSum, comm_, stream_), "all_reduce_sum");
    });
  }
  void all_gather(const void* send, int64_t n, void* recv, CommType t) override {
    staged(send, n, recv, n * size_, "all_gather", [&](const void* s, void* r) {
      check(ncclAllGather(s, r, size_t(n), nccl_type(t), comm_, stream_), "all_gather");
    });
  }
  void all_gatherv(const void* send, const int64_t* counts, void* recv, CommType t) override {
    // One broadcast per root, grouped (NCCL has no gatherv).
    const int64_t b = comm_type_bytes(t);
    int64_t total = 0;
    for (int q = 0; q < size_; ++q) total += counts[q];
    staged(send, counts[rank_], recv, total, "all_gatherv", [&](const void* s, void* r) {
      check(ncclGroupStart(), "all_gatherv");
      int64_t off = 0;
      for (int q = 0; q < size_; ++q) {
        char* dst = static_cast<char*>(r) + off * b;
        if (counts[q] > 0)
          check(ncclBroadcast(q == rank_ ? s : dst, dst, size_t(counts[q]), nccl_type(t), q, comm_, stream_),
                "all_gatherv");
        off += counts[q];
      }
      check(ncclGroupEnd(), "all_gatherv");
    });
  }
  void reduce_scatter_sum(const void* send, int64_t n, void* recv, CommType t) override {
    staged(send, n * size_, recv, n, "reduce_scatter_sum", [&](const void* s, void* r) {
      check(ncclReduceScatter(s, r, size_t(n), nccl_type(t), ncclSum, comm_, stream_), "reduce_scatter_sum");
    });
  }
  void all_to_allv(const void* send, const int64_t* sc, void* recv, const int64_t* rc, CommType t) override {
    const int64_t b = comm_type_bytes(t);
    int64_t ns = 0, nr = 0;
    for (int q = 0; q < size_; ++q) ns += sc[q], nr += rc[q];
    staged(send, ns, recv, nr, "all_to_allv", [&](const void* s, void* r) {
      check(ncclGroupStart(), "all_to_allv");
      int64_t so = 0, ro = 0;
      for (int q = 0; q < size_; ++q) {
        if (sc[q] > 0)
          check(ncclSend(static_cast<const char*>(s) + so * b, size_t(sc[q]), nccl_type(t), q, comm_, stream_),
                "all_to_allv");
        if (rc[q] > 0)
          check(ncclRecv(static_cast<char*>(r) + ro * b, size_t(rc[q]), nccl_type(t), q, comm_, stream_),
                "all_to_allv");
        so += sc[q], ro += rc[q];
      }
      check(ncclGroupEnd(), "all_to_allv");
    });
  }

 private:
  // Runs body(send', recv') on device buffers (the callers' own, or staged copies of host ones), then waits.
  template <typename F>
  void staged(const void* send, int64_t ns, void* recv, int64_t nr, const char* what, F&& body) {
    const bool host = (ns > 0 && !cuda::is_device_pointer(send)) || (nr > 0 && !cuda::is_device_pointer(recv));
    if (!host) {
      body(send, recv);
      wait(what);
      return;
    }
    const size_t sb = size_t(std::max<int64_t>(ns, 1)) * 4, rb = size_t(std::max<int64_t>(nr, 1)) * 4;
    if (stage_bytes_ < sb + rb) {
      if (stage_) cudaFree(stage_);
      stage_ = nullptr;
      stage_bytes_ = 0;
      cuda_check(cudaMalloc(&stage_, sb + rb), "cudaMalloc (staging)");
      stage_bytes_ = sb + rb;
    }
    char* ds = static_cast<char*>(stage_);
    char* dr = send == recv ? ds : ds + sb;  // in place stays in place
    if (ns > 0) cuda_check(cudaMemcpyAsync(ds, send, size_t(ns) * 4, cudaMemcpyDefault, stream_), what);
    body(ds, dr);
    wait(what);
    if (nr > 0) cuda_check(cudaMemcpyAsync(recv, dr, size_t(nr) * 4, cudaMemcpyDefault, stream_), what);
    cuda_check(cudaStreamSynchronize(stream_), what);
  }
  [[noreturn]] void die(const std::string& what, const std::string& why) {
    if (comm_ && !aborted_) {
      aborted_ = true;
      ncclCommAbort(comm_);
    }
    fail("NCCL rank {} of {}: {} failed: {}", rank_, size_, what, why);
  }
  void check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
    die(what, std::string(ncclGetErrorString(r)) + (last && *last ? std::string(" (") + last + ")" : ""));
  }
  void cuda_check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) die(what, cudaGetErrorString(e));
  }
  // Until the enqueued work is done: NCCL's async state and the stream, with a deadline.
  void wait(const char* what, bool stream = true) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int spin = 0;; ++spin) {
      ncclResult_t st = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &st);
      if (r != ncclSuccess) check(r, what);
      if (st != ncclSuccess && st != ncclInProgress) check(st, what);
      bool done = st == ncclSuccess;
      if (done && stream) {
        cudaError_t q = cudaStreamQuery(stream_);
        if (q != cudaSuccess && q != cudaErrorNotReady) cuda_check(q, what);
        done = q == cudaSuccess;
      }
      if (done) return;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > opt_.timeout_s)
        die(what, fmt::format("not finished after {:.0f} s (a peer rank died or hangs); the communicator was aborted", s));
      if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  int rank_, size_;
  NcclOptions opt_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  void* stage_ = nullptr;
  size_t stage_bytes_ = 0;
  bool aborted_ = false;
};

}  // namespace

std::string nccl_unique_id() {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) fail("ncclGetUniqueId failed: {}", ncclGetErrorString(r));
  return std::string(reinterpret_cast<const char*>(&id), sizeof id);
}

std::unique_ptr<Comm> make_nccl_comm(int rank, int size, const std::string& unique_id, const NcclOptions& opt) {
  return std::make_unique<NcclComm>(rank, size, unique_id, opt);
}

}  // namespace cm
#endif  // CLAWMINE_HAVE_NCCL
