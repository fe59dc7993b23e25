// CUDA backend foundation: error checks that throw cm::Error (never abort),
// RAII device buffers, a bump arena for per-step scratch, and a Context that
// owns a stream, a cuBLAS handle and the split-K workspace the linear kernels
// share. Included only by CUDA-aware code (it pulls in the CUDA runtime).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "backend/cuda/core/cuda_errors.h"

namespace cm::cuda {

// Arrays packed one after another into one staging buffer, each starting on a 256-byte boundary:
// take(bytes) returns the next array's offset; at is the buffer's size so far.
struct StagePacker {
  size_t at = 0;
  size_t take(size_t bytes) {
    const size_t here = at;
    at += (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    return here;
  }
};

class OpTimer;  // op_timer.h

// Throws cm::Error naming the failed call and CUDA's message.
void check_cuda(cudaError_t e, const char* what, const char* file, int line);
#define CM_CUDA(call) ::cm::cuda::check_cuda((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports launch-configuration errors at once.
#define CM_CUDA_LAUNCH(name) ::cm::cuda::check_cuda(cudaGetLastError(), name, __FILE__, __LINE__)

// Throws cm::Error for a failed cuBLAS call (status is a cublasStatus_t).
void check_cublas(int status, const char* what);

// Number of CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();
// True for device (or managed) memory; false for host memory, including pageable memory CUDA never saw.
bool is_device_pointer(const void* p);

// Owning device allocation (cudaMalloc). Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { alloc(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void alloc(size_t bytes);
  void release() noexcept;
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  void zero();
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  void* get() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Bump allocator over one device buffer: per-step scratch without cudaMalloc
// in the hot path. reset() frees everything at once.
class Arena {
 public:
  explicit Arena(size_t bytes) : buf_(bytes) {}
  void* take(size_t bytes, size_t align = 256);
  template <typename T>
  T* take_n(size_t n) { return static_cast<T*>(take(n * sizeof(T), 256)); }
  void reset() { used_ = 0; }
  size_t used() const { return used_; }
  size_t capacity() const { return buf_.size(); }

 private:
  DeviceBuffer buf_;
  size_t used_ = 0;
};

// Per-device values the kernels need, measured once when the Context is made
// (kernel_setup.h), never held in process-wide statics.
struct KernelSetup {
  int nvfp4_decode_occupancy[3] = {};  // split-K decode kernel, MT = 1, 2, 4
  int fp8_decode_occupancy[3] = {};
};

// Scratch the linear kernels share. Reserved up front; a call that needs more
// is an error naming the buffer, never a reallocation inside a call (a grown
// buffer would free memory a captured CUDA graph still points to).
struct Workspace {
  size_t splitk_floats = 0;    // split-K partial tiles (f32)
  size_t splitk_counters = 0;  // per-tile arrival counters
  size_t panel_bytes = 0;      // dequantised BF16 weight panels (prefill through cuBLAS)
};

// Everything a kernel launch needs besides its operands. One per stream:
// the split-K workspace and counters are reused by consecutive launches on
// that stream and must not be shared between streams.
class Context {
 public:
  // pdl: launch the decode kernels with programmatic dependent launch, so a
  // kernel starts (and prefetches its weights into L2) while the previous
  // kernel on the stream finishes; its activations are read only after
  // griddepcontrol.wait. Off = plain stream order (bench --no-pdl).
  // The workspace starts at what any single linear's split-K can use on this
  // device (default_workspace) plus panel_bytes of panel scratch.
  explicit Context(int device = 0, bool pdl = true, size_t panel_bytes = size_t(256) << 20);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  cudaStream_t stream() const { return stream_; }
  void* cublas() const { return cublas_; }  // cublasHandle_t, bound to stream()
  void sync();
  int sm_count() const { return sm_count_; }
  bool pdl() const { return pdl_; }

  int device() const { return device_; }
  const KernelSetup& setup() const { return setup_; }

  // The op timer the step's OpScopes record into (op_timer.h; not owned; null: none).
  void set_timer(OpTimer* t) { timer_ = t; }
  OpTimer* timer() const { return timer_; }

  // Grows the workspace to at least w (synchronises the stream; call between
  // steps, never while capturing a graph).
  void reserve_workspace(const Workspace& w);
  const Workspace& workspace() const { return ws_; }
  // Device bytes the Context holds (workspace, panels, cuBLAS workspace).
  size_t device_bytes() const { return partials_.size() + counters_.size() + panel_.size() + cublas_ws_.size(); }
  // The split-K bound of the linear kernels on this device: a decode kernel
  // splits K over at most SMs·occupancy CTAs (tiles of 16 rows × 32 tokens),
  // the wgmma kernel over at most 2·SMs tiles of 128 × 256.
  static Workspace default_workspace(int sm_count, const KernelSetup& setup);

  // Split-K partial sums (f32) and per-tile arrival counters (kept at zero
  // between launches by the kernels themselves). Throw when the reserved
  // workspace is smaller than asked.
  float* splitk_partials(size_t floats);
  unsigned* splitk_counters(size_t n);
  // Scratch for the exact wgmma linear's reordered activations (sm90_nvfp4_exact_wgmma.cu). It is the
  // split-K partials' memory: that kernel splits nothing, and launches on one stream never overlap.
  void* reorder_scratch(size_t bytes);
  size_t reorder_scratch_bytes() const { return ws_.splitk_floats * sizeof(float); }
  // Scratch for dequantized weight panels (prefill path through cuBLAS).
  void* panel_scratch(size_t bytes);

 private:
  cudaStream_t stream_ = nullptr;
  void* cublas_ = nullptr;
  int device_ = 0;
  int sm_count_ = 0;
  bool pdl_ = true;
  KernelSetup setup_;
  OpTimer* timer_ = nullptr;
  Workspace ws_;
  DeviceBuffer partials_, counters_, panel_, cublas_ws_;
};

// Launches kernel<<<grid, block, smem, ctx.stream()>>>(args...), with the
// programmatic-stream-serialization attribute when ctx.pdl(). The kernel must
// call griddepcontrol.wait before reading anything a previous kernel wrote.
template <typename... KArgs, typename... Args>
void launch_kernel(Context& ctx, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, const char* name,
                   Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ctx.stream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = ctx.pdl() ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), name, __FILE__, __LINE__);
}

}  // namespace cm::cuda
