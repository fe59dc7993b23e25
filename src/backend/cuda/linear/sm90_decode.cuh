// The small-M decode kernel of the weight-format linears, written once over the format (NVFP4/MXFP4:
// Nvfp4Format in sm90_nvfp4_linear.cu; FP8: Fp8Format in sm90_fp8_linear.cu).
//
// One CTA (4 warps) owns a 16-row block and a K range; each warp walks 64-wide chunks of that range,
// issuing the 16-byte weight loads of several chunks before expanding any of them, so many loads are in
// flight per SM. The 4 warps reduce through shared memory; when K is split across CTAs (few row blocks)
// each CTA writes its partial tile and the last CTA to arrive for that row block sums the partials in a
// fixed order (deterministic) and writes the output, so a whole linear is one launch.
//
// A format F supplies (as static members of a traits struct, in its .cu file):
//   Params                       the kernel's parameter struct: w, chunks, N, K, row_blocks,
//                                rows_per_group, x, ldx, M, y, ldy, y_bf16, ksplit, chunks_per_split,
//                                partials, counters (and whatever the format reads beside them);
//   template <int MT, bool PIPE> static constexpr int kUnroll;   chunks per batch of loads;
//   prefetch(p, u0, n)           the L2 prefetch of chunks [u0, u0+n) of the weights (and scales);
//   Block, block(p, rb, lane, g, t)    where this lane's weights and scales of row block rb start;
//   kloop<MT, U, PIPE>(blk, xrow, xok, c_first, c_end, cstep, K, t, acc)   one warp's chunk walk
//                                (how a K chunk of weights and scales is loaded and expanded);
//   kScaledOutput, out_scale(p)  whether the stored tile is multiplied by a factor, and that factor;
//   occupancy(ctx), kName, kPairName   the host side: split-K occupancies, launch names.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/core/cuda_util.h"
#include "backend/cuda/linear/linear_host.cuh"
#include "backend/cuda/linear/sm90_nvfp4.cuh"
#include "backend/cuda/linear/sm90_splitk.cuh"

namespace cm::cuda::sm90 {

constexpr int kDecodeWarps = 4;

// One CTA's work: row block rb, K split `split` of the linear p. PIPE: pipelined chunk loop (split-K,
// matrices with few row blocks); !PIPE: the plain loop with more resident warps (many row blocks).
template <class F, int MT, bool PIPE>
__device__ __forceinline__ void decode_cta(const typename F::Params& p, const int rb, const int split) {
  constexpr int U = F::template kUnroll<MT, PIPE>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t c_begin = int64_t(split) * p.chunks_per_split;
  const int64_t c_end = min(p.chunks, c_begin + p.chunks_per_split);
  const int64_t xcol = int64_t(rb * 16 / p.rows_per_group) * p.K + 16 * t;
  // Weights never depend on earlier kernels: start pulling this CTA's slice into L2 now, then wait for
  // the previous kernel (programmatic dependent launch; a no-op without it) before reading x or the
  // split-K workspace.
  if (threadIdx.x == 0 && c_end > c_begin) {
    const int64_t u0 = int64_t(rb) * p.chunks + c_begin, n = c_end - c_begin;
    F::prefetch(p, u0, n);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");

  const typename F::Block blk = F::block(p, rb, lane, g, t);
  const __nv_bfloat16* xrow[MT];
  bool xok[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int tok = g + 8 * mt;
    xok[mt] = tok < p.M;
    xrow[mt] = p.x + int64_t(xok[mt] ? tok : 0) * p.ldx + xcol;
  }
  float acc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
  F::template kloop<MT, U, PIPE>(blk, xrow, xok, c_begin + warp, c_end, kDecodeWarps, p.K, t, acc);

  __shared__ float red[kDecodeWarps * 8 * MT * 16];
  float vals[MT];
  reduce_warps<MT>(acc, red, vals);
  if (!splitk_combine<MT>(vals, p.partials, p.counters, p.ksplit, split, p.row_blocks, rb)) return;
  // A format without an output factor stores a literal 1 (a factor 1 returned by a function compiles to
  // other SASS).
  if constexpr (F::kScaledOutput)
    store_tile<MT>(vals, rb, p.M, p.N, p.y, p.ldy, p.y_bf16 != 0, F::out_scale(p));
  else
    store_tile<MT>(vals, rb, p.M, p.N, p.y, p.ldy, p.y_bf16 != 0, 1.0f);
}

template <class F, int MT, bool PIPE>
__global__ void __launch_bounds__(128) decode_kernel(const typename F::Params p) {
  decode_cta<F, MT, PIPE>(p, blockIdx.x, blockIdx.y);
}

// Two linears of one input in one launch (linear_nvfp4_pair, linear_fp8_pair): each CTA runs its
// linear's (row block, split) as decode_kernel's grid would, with that linear's own partials and
// counters, so every output has the bits of its own launch.
template <class F, int MT>
__global__ void __launch_bounds__(128) decode_pair_kernel(const typename F::Params a, const typename F::Params b) {
  int rb, split;
  if (pair_cta(a.row_blocks, a.ksplit, b.row_blocks, rb, split))
    decode_cta<F, MT, true>(a, rb, split);
  else
    decode_cta<F, MT, true>(b, rb, split);
}

}  // namespace cm::cuda::sm90

namespace cm::cuda {

// The split-K kernels' occupancies at MT = 1, 2, 4 (they size the split-K scratch, cuda_util.cu; the
// split itself takes the one-token kernel's for every MT, decode_split).
template <class F>
void decode_occupancy(int (&occ)[3]) {
  CM_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ[0], sm90::decode_kernel<F, 1, true>, 128, 0));
  CM_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ[1], sm90::decode_kernel<F, 2, true>, 128, 0));
  CM_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ[2], sm90::decode_kernel<F, 4, true>, 128, 0));
}

// The decode launch of one slice of at most 32 tokens (p: the weight's and slice's parameters).
template <class F, int MT>
void launch_decode(Context& ctx, typename F::Params p) {
  const int64_t row_blocks = p.row_blocks, chunks = p.chunks;
  if (row_blocks >= int64_t(ctx.sm_count()) * 8) {
    // Many row blocks (wq_b, the LM head): one CTA per row block, no split, the plain loop (measured
    // faster here than the pipelined one).
    p.ksplit = 1;
    p.chunks_per_split = int(chunks);
    launch_kernel(ctx, sm90::decode_kernel<F, MT, false>, dim3(unsigned(row_blocks)), dim3(128), 0, F::kName, p);
    return;
  }
  // Split K so that about one wave of CTAs covers the matrix (linear_host.cuh).
  const SplitK sk = decode_split(ctx.sm_count(), F::occupancy(ctx), row_blocks, chunks);
  p.ksplit = int(sk.ksplit);
  p.chunks_per_split = int(sk.per);
  if (sk.ksplit > 1) {
    p.partials = ctx.splitk_partials(size_t(sk.ksplit * row_blocks * 128 * MT));
    p.counters = ctx.splitk_counters(size_t(row_blocks));
  }
  dim3 grid(unsigned(row_blocks), unsigned(sk.ksplit));
  launch_kernel(ctx, sm90::decode_kernel<F, MT, true>, grid, dim3(128), 0, F::kName, p);
}

// The pair launch of one slice of at most 32 tokens (the split-K path of both, as launch_decode chooses
// it); false (nothing launched) when the two split-K workspaces do not fit side by side.
template <class F, int MT>
bool launch_decode_pair(Context& ctx, typename F::Params a, typename F::Params b) {
  typename F::Params* p[2] = {&a, &b};
  for (int k = 0; k < 2; ++k) {
    const SplitK sk = decode_split(ctx.sm_count(), F::occupancy(ctx), p[k]->row_blocks, p[k]->chunks);
    p[k]->ksplit = int(sk.ksplit);
    p[k]->chunks_per_split = int(sk.per);
  }
  if (!decode_pair_workspace(ctx, a, b, MT)) return false;
  const int64_t ctas = int64_t(a.row_blocks) * a.ksplit + int64_t(b.row_blocks) * b.ksplit;
  launch_kernel(ctx, sm90::decode_pair_kernel<F, MT>, dim3(unsigned(ctas)), dim3(128), 0, F::kPairName, a, b);
  return true;
}

}  // namespace cm::cuda
