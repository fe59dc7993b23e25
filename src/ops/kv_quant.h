// The FP8 KV cache's rounding (--kv-cache-dtype fp8; the layout vLLM calls fp8_ds_mla for V4, and the
// numbers DeepSeek's reference keeps in its bf16 buffers):
//   attention rows and compressed entries ([nope | rope], the shared K=V head): the nope channels in
//     E4M3 with one power-of-two (UE8M0) scale per 64 channels, s = 2^ceil(log2(max(amax, 1e-4) / 448)),
//     a partial last block of its own; the rope channels in BF16. On the GPU: 448 + 128 + 8 bytes per
//     row of V4's 512 channels (7 scales and a pad) against 1,024 in BF16.
//   indexer keys: every channel in E4M3 with one FP32 scale per key, s = max(amax, 1e-4) / 448
//     (132 bytes per 128-channel key).
// The CPU backend (BackendOptions::kv_cache) rounds its f32 cache to these values: the same numbers
// an FP8 cache holds, without its memory saving (the oracle for a GPU one, which is not built yet).
// Each row is rounded alone, so a row's value does not depend on its step, chunk or batch. The window
// rows a token attends to and the ones its slot keeps are the same rounded rows; the compressor's
// pending rows stay in full precision (they are not the cache). A NaN stays NaN (non-finite detection
// still sees it); an infinity becomes NaN.
#pragma once
#include <cstdint>

namespace cm {

constexpr int64_t kKvFp8Block = 64;  // nope channels per UE8M0 scale

// rows: [n, dim] in place; the last rope_dim channels are the rope part (0 <= rope_dim <= dim).
void kv_fp8_round_cpu(float* rows, int64_t n, int64_t dim, int64_t rope_dim);
// keys: [n, dim] in place.
void index_key_fp8_round_cpu(float* keys, int64_t n, int64_t dim);

}  // namespace cm
