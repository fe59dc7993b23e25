// The engine seam: one model step over many sequences, whatever the device. The interface only
// (as ggml-backend.h is to ggml-cuda): the backends implement it (backend/cpu, backend/cuda), the
// factory makes one (factory/factory.h), and callers above see nothing else.
//
// A step takes n tokens from any number of sequences ("slots"). A slot's tokens
// are contiguous in the batch and in position order, and pos[i] continues that
// slot's state exactly (the first token of a slot in a step has pos = the
// number of tokens the slot already holds). Every buffer a backend needs
// (per-slot caches, activations, scratch) is sized once by reserve() from a
// CacheShape; a step that asks for more than was reserved is an error naming
// the limit, never a reallocation (llm.c's "allocate once, check every call").
// The CPU backend (fp32, the oracle) and the CUDA backend implement the same
// interface; callers (runtime::Engine, which the server and the CLI drive, and the tests) see only this.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "seam/observer.h"
#include "ops/linear.h"
#include "ops/sample.h"

namespace cm {

class Comm;

// One engine step (llama.cpp's llama_batch shape: every token carries its
// position and sequence). Arrays are [n]; logits[i] = 1 asks for row i's logits.
struct Batch {
  int32_t n = 0;
  const int32_t* token = nullptr;
  const int32_t* pos = nullptr;
  const int32_t* slot = nullptr;
  const uint8_t* logits = nullptr;
  // Speculative steps (MTP's verify steps): undo[i] = 1 marks a row whose slot keeps an undo log: the
  // backend keeps the previous contents of every state row that slot's run writes, so that rollback_slot
  // can return it to any position since its log opened. Every row of a slot's run carries the same flag;
  // a slot's undoable span is at most undo_token_limit() tokens. A run without it (a prefill chunk, a
  // plain decode token; or undo = null: every run) ends its slot's undo log.
  const uint8_t* undo = nullptr;
};

// How the rows with logits of the last step are sampled where they were computed (ops/sample.h: the
// same tokens as sample_rows_cpu over the logits step() returns). Host arrays, one entry per row with
// logits[i] = 1, in batch order (R of them).
struct StepSampling {
  const SampleParams* params = nullptr;  // [R]
  const SampleAdjust* adj = nullptr;     // logit bias and penalties by row (CSR, distinct ids per row); may be null
  const int64_t* adj_offsets = nullptr;  // [R + 1] when adj is set
  const uint32_t* mask = nullptr;        // [R, mask_words] allowed-token bits, or null
  int64_t mask_words = 0;
  int32_t* token = nullptr;              // out [R]
  float* logprob = nullptr;              // out [R]: the token's logprob under the raw logits
  // top_n in [0, kMaxSampleTopN] (ops/sample.h): the raw distribution's top_n ids and logprobs per row.
  int32_t top_n = 0;
  int32_t* top_id = nullptr;      // out [R, top_n]
  float* top_logprob = nullptr;   // out [R, top_n]
};

// Drafting with the checkpoint's MTP block (speculative decoding; ModelBackend::draft). Host arrays.
struct DraftRequest {
  int32_t n = 0;                         // slots
  const int32_t* slot = nullptr;         // [n] distinct slots, each holding at least one token
  const int32_t* token = nullptr;        // [n] each slot's next token: drawn from its last logits, not yet fed
  // [n] how the drafts are drawn (ops/sample.h; draft j of a row uses counter + j, the counter of the
  // target token it proposes), without penalties, bias or masks; null: greedy.
  const SampleParams* params = nullptr;
  int32_t k = 1;                         // drafts per slot, in [1, kMaxDraft]
  int32_t* out = nullptr;                // out [n, k]
};
constexpr int32_t kMaxDraft = 7;

// Sizes only. max_ctx is the longest sequence a slot may hold (positions
// 0 … max_ctx−1); it may not exceed the model's max_position_embeddings.
struct CacheShape {
  int32_t max_slots = 1;
  int32_t max_step_tokens = 512;
  int64_t max_ctx = 4096;
};

enum class Device : uint8_t { CPU, CUDA };
inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

// Sees the fp32 input x[m, K] (rows ldx apart) of every linear a step runs
// (calibration records activation amax per linear). Called from the step's thread.
struct LinearInputObserver {
  virtual ~LinearInputObserver() = default;
  virtual void observe_input(const LinearWeight& w, const float* x, int64_t m, int64_t ldx) = 0;
};

// The per-slot attention cache's precision: AUTO, the backend's own (CPU f32, CUDA bf16); FP8, rows,
// compressed entries and indexer keys rounded to the FP8 cache layout (ops/kv_quant.h).
enum class KvCache { AUTO, FP8 };

// Behaviour of a backend, fixed when it is made.
struct BackendOptions {
  Observer* observer = nullptr;                  // sees every named intermediate (--layer-stats, dumps)
  // CUDA: the fraction of the device's total memory the backend may use (weights, per-slot state,
  // activations, workspaces), in (0, 1]; loading and reserve() refuse what does not fit in
  // min(free, utilization·total) (vLLM's --gpu-memory-utilization).
  double gpu_memory_utilization = 0.9;
  // CUDA: the device this backend's weights, state and streams live on (one GPU per expert-parallel
  // rank: the launcher's LOCAL_RANK).
  int cuda_device = 0;
  // CUDA: replay each step of up to 256 rows as a CUDA graph captured once per (rows, logits rows)
  // (same kernels, same bits as eager); false runs every kernel launch eagerly (--enforce-eager).
  bool cuda_graphs = true;
  // CUDA: steps of up to 256 rows run a layer's independent branches side by side on a second stream
  // (the compressor and indexer projections beside the query path; the shared expert beside the router
  // and the routed experts): the same kernels on the same inputs, so the same bits; false runs every
  // kernel on one stream (--no-concurrent-branches).
  bool concurrent_branches = true;
  // CUDA: every row's result independent of the other rows of its step (true: the decode kernels'
  // sums at every batch size, so a prompt gives the same logits however it is chunked or batched).
  // false (--fast-prefill): steps of more than 256 rows (prefill chunks; never graphed) run their
  // FP8/NVFP4 linears as BF16-expanded cuBLAS GEMMs — faster prefill, but a row's logits then depend
  // on the step it was computed in. Decode steps (256 rows or fewer) are the same either way.
  bool batch_invariant = true;
  KvCache kv_cache = KvCache::AUTO;              // --kv-cache-dtype auto|fp8 (CPU only, for now)
  LinearInputObserver* linear_inputs = nullptr;  // CPU: sees every linear's input (calibration)
  ActQuant act_quant = ActQuant::NONE;           // CPU: W4A4 emulation of NVFP4 linears
  // CPU: expert parallelism over ep_comm's ranks (null or one rank: off). Rank r owns the
  // routed experts [r·E/R, (r+1)·E/R) and its Model must be loaded with that expert range
  // (LoadOptions::experts). A step is a collective: all ranks call it together.
  //   ep_data_parallel false: every rank runs the same batch (attention, router and shared expert
  //                           replicated; each rank gets the whole step's logits);
  //   ep_data_parallel true:  each rank runs its own batch (its own sequences, any size; attention
  //                           data-parallel) and only the routed experts' rows cross ranks.
  Comm* ep_comm = nullptr;
  bool ep_data_parallel = false;
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;
  virtual Device device() const = 0;
  // The only place that allocates. May be called again to resize (drops every slot's state).
  virtual void reserve(const CacheShape& shape) = 0;
  // Sizing a reservation to the device (the server's GPU defaults): the bytes reserve(shape) would
  // allocate (per-slot state, activations, scratch), and the bytes the backend may allocate for one
  // beside what it holds (its memory budget less the weights and workspaces). A backend that does not
  // budget memory (the CPU's) returns 0 and SIZE_MAX. Meant before the first reserve().
  virtual size_t reserve_bytes(const CacheShape&) const { return 0; }
  virtual size_t reserve_budget() const { return SIZE_MAX; }
  virtual const CacheShape& shape() const = 0;
  // Bytes of per-sequence state for one slot of shape().max_ctx (also valid before reserve()
  // for the shape given).
  virtual size_t bytes_per_slot(const CacheShape& shape) const = 0;
  // Tokens the slot holds (its next position).
  virtual int64_t slot_pos(int32_t slot) const = 0;
  virtual void reset_slot(int32_t slot) = 0;
  // `to` becomes a copy of `from` (prefix reuse, forking); `from` is unchanged.
  virtual void copy_slot(int32_t from, int32_t to) = 0;
  // The longest span of undoable steps a slot may hold before it is rolled back or committed: the
  // smallest ring of the model's state (a window of W rows, a compressor's c·m pending rows); 0 when
  // this backend cannot roll back.
  virtual int64_t undo_token_limit() const { return 0; }
  // The slot returns to holding `pos` tokens, its state bit for bit that of a run that never saw the
  // positions after pos, and its undo log ends. pos must lie in [the position of the slot's first
  // undoable step since its log opened, slot_pos(slot)]; rollback_slot(s, slot_pos(s)) just ends the
  // log (commits). Anything else throws naming the slot and the range, and changes nothing.
  virtual void rollback_slot(int32_t slot, int64_t pos) {
    if (pos == slot_pos(slot)) return;
    throw std::logic_error("rollback_slot: this backend keeps no undo log");
  }
  // MTP: true when the backend runs the model's first MTP block (its model was loaded with the MTP
  // weights). Every step then also feeds the block the tokens it embeds (its window state lags the
  // slot by one position and rolls back with it), and draft() proposes tokens.
  virtual bool has_mtp() const { return false; }
  // Proposes r.k tokens per slot: the block applied r.k times from the slot's last hidden state and its
  // next token (each time on its own output and the token just drafted). Leaves no trace in any slot
  // (the window rows it writes are put back) and no logits for sample_last_step. Throws (naming the
  // slot or the limit) when a slot is empty, the drafts would pass the context, or there is no block.
  virtual void draft(const DraftRequest& r) {
    (void)r;
    throw std::logic_error("draft: this backend runs no MTP block");
  }
  // The slot's state as bytes (every state tensor's rows of that slot, in layout order; the CUDA
  // backend's window rows and entries in bf16): tests compare two slots or two runs bit for bit.
  virtual std::vector<uint8_t> slot_state(int32_t slot) const {
    (void)slot;
    throw std::logic_error("slot_state: not implemented by this backend");
  }
  // Runs the step; writes [rows with logits[i] = 1, vocab] fp32 logits in batch order.
  // Throws cm::Error (naming the limit, the slot or the bad token) and leaves every slot as it
  // was when the batch is invalid; a step whose logits are non-finite throws naming the first
  // intermediate that went non-finite.
  virtual void step(const Batch& batch, float* logits_out) = 0;

  // Sampling where the logits are (issue: the host neither copies nor scans B x vocab floats).
  // A backend that can returns true here; its step() then accepts logits_out = nullptr (the logits
  // stay on its device, unchecked) and sample_last_step() samples that step's logits rows: it checks
  // them (non-finite logits throw as step() does, naming the first intermediate that went
  // non-finite; a row whose mask allows nothing throws) and writes tokens and logprobs. The tokens are
  // sample_rows_cpu's over the same logits, so a caller may sample either way and draw the same bits.
  virtual bool samples_on_device() const { return false; }
  // At most max_sample_rows() rows; adjustments at most kMaxSampleAdjust per step.
  virtual void sample_last_step(const StepSampling& s) {
    (void)s;
    throw std::logic_error("sample_last_step: this backend does not sample on its device (samples_on_device())");
  }
  static constexpr int64_t kMaxSampleAdjust = int64_t(1) << 19;
  // The logits rows sample_last_step takes: one per slot, and with an MTP block the verify rows too.
  virtual int64_t max_sample_rows() const { return shape().max_slots; }
};

}  // namespace cm
