// Per-device kernel setup, run by cuda::Context when it is created for a
// device (never in a process-wide static: attributes such as the dynamic
// shared-memory limit belong to a device, and a second device or a reset one
// must get them too). Each kernel file that needs setup defines its function.
#pragma once

namespace cm {
namespace cuda {
struct KernelSetup;
}

void setup_attention_kernels(int device);

namespace cuda {
// Fills the occupancy of the split-K decode kernels (sm90_nvfp4_linear.cu, sm90_fp8_linear.cu).
void setup_nvfp4_decode_kernels(KernelSetup& s);
void setup_fp8_decode_kernels(KernelSetup& s);
// Raises the dynamic shared-memory limit of the FP8 prefill kernel (sm90_fp8_prefill.cu).
void setup_fp8_prefill_kernels();
// Raises the dynamic shared-memory limit of the wgmma prefill kernels (sm90_nvfp4_wgmma.cu).
void setup_wgmma_kernels();
// Raises the dynamic shared-memory limit of the MoE prefill kernels (sm90_nvfp4_moe.cu).
void setup_moe_kernels();
// The wgmma MoE prefill kernels' shared-memory limits (moe/sm90_nvfp4_moe_wgmma.cu).
namespace moe {
void setup_moe_wgmma_kernels();
}
// Raises the dynamic shared-memory limit of the NVFP4 prefill kernel (sm90_nvfp4_prefill.cu).
void setup_nvfp4_prefill_kernels();
// Raises the shared-memory limit of the exact wgmma kernel (sm90_nvfp4_exact_wgmma.cu).
void setup_nvfp4_exact_wgmma_kernels();
// The same for the FP8 one (sm90_fp8_exact_wgmma.cu).
void setup_fp8_exact_wgmma_kernels();
}  // namespace cuda

}  // namespace cm
