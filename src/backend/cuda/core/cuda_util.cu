// CUDA backend foundation (see cuda_util.h): every runtime/cuBLAS failure
// becomes a cm::Error with the call that failed.
#include <cublas_v2.h>

#include "backend/cuda/core/cuda_util.h"

#include <algorithm>

#include "backend/cuda/core/kernel_setup.h"

namespace cm::cuda {

void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear the sticky-free error state so later calls can proceed
  throw_error(strf("CUDA error in %s (%s:%d): %s (%d)", what, file, line, cudaGetErrorString(e), int(e)));
}

void check_cublas(int s, const char* what) {
  if (s != int(CUBLAS_STATUS_SUCCESS)) throw_error(strf("cuBLAS error in %s: status %d", what, int(s)));
}

bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  if (p == nullptr || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void DeviceBuffer::alloc(size_t bytes) {
  release();
  if (bytes == 0) return;
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw_error(strf("CUDA out of memory: cannot allocate %.1f MiB (%s)", double(bytes) / (1 << 20), cudaGetErrorString(e)));
  }
  ptr_ = p;
  bytes_ = bytes;
}

void DeviceBuffer::release() noexcept {
  if (ptr_) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  CM_CU_CHECK(offset + bytes <= bytes_, "device upload of %zu bytes at %zu overflows a %zu-byte buffer", bytes, offset, bytes_);
  CM_CUDA(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  CM_CU_CHECK(offset + bytes <= bytes_, "device download of %zu bytes at %zu overflows a %zu-byte buffer", bytes, offset, bytes_);
  CM_CUDA(cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::zero() {
  if (ptr_) CM_CUDA(cudaMemset(ptr_, 0, bytes_));
}

void* Arena::take(size_t bytes, size_t align) {
  size_t start = (used_ + align - 1) / align * align;
  CM_CU_CHECK(start + bytes <= buf_.size(), "device arena exhausted: need %zu bytes, %zu of %zu used", bytes, used_, buf_.size());
  used_ = start + bytes;
  return static_cast<char*>(buf_.get()) + start;
}

Context::Context(int device, bool pdl, size_t panel_bytes) : device_(device), pdl_(pdl) {
  CM_CU_CHECK(device_count() > device, "no CUDA device %d (found %d)", device, device_count());
  CM_CUDA(cudaSetDevice(device));
  // A blocking stream: it stays ordered with work on the legacy default stream (uploads, fills).
  CM_CUDA(cudaStreamCreate(&stream_));
  CM_CUDA(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  cublas_ = h;
  check_cublas(cublasSetStream(h, stream_), "cublasSetStream");
  // An explicit workspace keeps cuBLAS calls capturable in CUDA graphs.
  cublas_ws_.alloc(size_t(64) << 20);
  check_cublas(cublasSetWorkspace(h, cublas_ws_.get(), cublas_ws_.size()), "cublasSetWorkspace");
  // Per-device kernel setup: attributes and occupancies belong to this device.
  setup_nvfp4_decode_kernels(setup_);
  setup_fp8_decode_kernels(setup_);
  setup_wgmma_kernels();
  setup_moe_kernels();
  moe::setup_moe_wgmma_kernels();
  setup_nvfp4_prefill_kernels();
  setup_nvfp4_exact_wgmma_kernels();
  setup_fp8_exact_wgmma_kernels();
  setup_attention_kernels(device);
  Workspace w = default_workspace(sm_count_, setup_);
  w.panel_bytes = panel_bytes;
  reserve_workspace(w);
}

Workspace Context::default_workspace(int sm_count, const KernelSetup& setup) {
  const size_t sms = size_t(std::max(sm_count, 1));
  int occ = 1;
  for (int i = 0; i < 3; ++i) occ = std::max({occ, setup.nvfp4_decode_occupancy[i], setup.fp8_decode_occupancy[i]});
  Workspace w;
  // decode (choose_splitk): a split matrix has ksplit·row_blocks <= SMs·occupancy tiles of 128·MT (MT <= 4)
  // floats and fewer than 8·SMs row blocks (one counter each); wgmma: ksplit·tiles <= 2·SMs of 128 × 256.
  w.splitk_floats = std::max(sms * size_t(occ) * 128 * 4, 2 * sms * 128 * 256);
  w.splitk_counters = std::max(8 * sms, 2 * sms);
  return w;
}

void Context::reserve_workspace(const Workspace& w) {
  if (w.splitk_floats > ws_.splitk_floats) {
    sync();
    partials_.alloc(w.splitk_floats * 4);
    ws_.splitk_floats = w.splitk_floats;
  }
  if (w.splitk_counters > ws_.splitk_counters) {
    sync();
    counters_.alloc(w.splitk_counters * 4);
    CM_CUDA(cudaMemsetAsync(counters_.get(), 0, w.splitk_counters * 4, stream_));
    sync();
    ws_.splitk_counters = w.splitk_counters;
  }
  if (w.panel_bytes > ws_.panel_bytes) {
    sync();
    panel_.alloc(w.panel_bytes);
    ws_.panel_bytes = w.panel_bytes;
  }
}

Context::~Context() {
  if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  if (stream_) cudaStreamDestroy(stream_);
}

void Context::sync() { CM_CUDA(cudaStreamSynchronize(stream_)); }

float* Context::splitk_partials(size_t floats) {
  CM_CU_CHECK(floats <= ws_.splitk_floats,
              "split-K workspace too small: a linear needs %zu floats, %zu reserved (Context::reserve_workspace)",
              floats, ws_.splitk_floats);
  return partials_.as<float>();
}

unsigned* Context::splitk_counters(size_t n) {
  CM_CU_CHECK(n <= ws_.splitk_counters,
              "split-K counters too few: a linear needs %zu, %zu reserved (Context::reserve_workspace)", n,
              ws_.splitk_counters);
  return counters_.as<unsigned>();
}

void* Context::reorder_scratch(size_t bytes) {
  CM_CU_CHECK(bytes <= reorder_scratch_bytes(),
              "reorder scratch too small: a linear needs %zu bytes, %zu reserved (Context::reserve_workspace)", bytes,
              reorder_scratch_bytes());
  return partials_.get();
}

void* Context::panel_scratch(size_t bytes) {
  CM_CU_CHECK(bytes <= ws_.panel_bytes,
              "weight panel scratch too small: a prefill linear needs %zu bytes, %zu reserved "
              "(Context::reserve_workspace)",
              bytes, ws_.panel_bytes);
  return panel_.get();
}

}  // namespace cm::cuda
