// cuBLAS loaded on first use. Linking libcublas makes the dynamic loader map
// and relocate libcublas + libcublasLt (about 570 MB of libraries) at every
// start: 220 MB of resident memory and half a second before main(), even for
// `clawmine --version` or a CPU-only run. The engine calls six cuBLAS entry
// points; this file defines them (same names and signatures as cublas_api.h,
// so the compiler checks them) and forwards each to the real library, opened
// with dlopen the first time one is called. A missing library becomes a
// cm::Error naming it, not a failure to start.
#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "common/error.h"

namespace {

void* cublas_symbol(const char* name) {
  static void* lib = nullptr;
  static std::string load_error;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string so = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    lib = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = ::dlerror();
      load_error = e ? e : so + ": cannot be loaded";
    }
  });
  if (!lib) cm::fail("cuBLAS is needed for this operation but could not be loaded: {}", load_error);
  void* f = ::dlsym(lib, name);
  if (!f) cm::fail("cuBLAS: {} not found in libcublas.so.{}", name, CUBLAS_VER_MAJOR);
  return f;
}

// The real function `name`, looked up once per entry point.
template <typename Fn>
Fn real(const char* name) {
  return reinterpret_cast<Fn>(cublas_symbol(name));
}

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  static auto f = real<decltype(&cublasCreate_v2)>("cublasCreate_v2");
  return f(handle);
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  static auto f = real<decltype(&cublasDestroy_v2)>("cublasDestroy_v2");
  return f(handle);
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  static auto f = real<decltype(&cublasSetStream_v2)>("cublasSetStream_v2");
  return f(handle, stream);
}

cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  static auto f = real<decltype(&cublasSetWorkspace_v2)>("cublasSetWorkspace_v2");
  return f(handle, workspace, bytes);
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                         int lda, const void* B, cudaDataType Btype, int ldb, const void* beta,
                                         void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                         cublasGemmAlgo_t algo) {
  using Fn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  static auto f = real<Fn>("cublasGemmEx");
  return f(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType,
           algo);
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                                       cublasOperation_t transb, int m, int n, int k,
                                                       const void* alpha, const void* A, cudaDataType Atype, int lda,
                                                       long long int strideA, const void* B, cudaDataType Btype,
                                                       int ldb, long long int strideB, const void* beta, void* C,
                                                       cudaDataType Ctype, int ldc, long long int strideC,
                                                       int batchCount, cublasComputeType_t computeType,
                                                       cublasGemmAlgo_t algo) {
  using Fn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                const void*, cudaDataType, int, long long int, const void*, cudaDataType, int,
                                long long int, const void*, void*, cudaDataType, int, long long int, int,
                                cublasComputeType_t, cublasGemmAlgo_t);
  static auto f = real<Fn>("cublasGemmStridedBatchedEx");
  return f(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype,
           ldc, strideC, batchCount, computeType, algo);
}

}  // extern "C"
