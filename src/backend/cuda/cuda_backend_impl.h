// The CUDA backend's class (cuda_backend.h is its public face): what a step holds and the blocks it runs.
// Its definitions, by concern: cuda_backend.cu (the step top to bottom, slots, graphs), cuda_reserve.cu
// (reserve: every buffer of a reservation), cuda_attention_block.cu, cuda_moe_block.cu (the two halves of a
// layer) and cuda_backend_notes.cu (named intermediates: the non-finite counts and the observer).
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <tuple>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/core/cuda_util.h"
#include "comm/comm.h"
#include "backend/cuda/core/op_timer.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/device_observer.h"
#include "backend/cuda/step/step_kernels.h"
#include "backend/step_plan.h"
#include "backend/undo_log.h"
#include "ops/compressor.h"
#include "ops/hc.h"
#include "ops/sample.h"

namespace cm {

using cuda::DeviceBuffer;
using cuda::DevLinear;
using cuda::Context;

// Per layer, all slots: views into the state buffer (backend/step_plan.h's layout, bf16 rows).
struct LayerState {
  uint16_t* window = nullptr;  // bf16 [S, W, hd]
  CompressorStateView comp, index;
};

// A named intermediate of this step: the count buffer row it was counted into.
struct NoteTag {
  const char* what = nullptr;
  int64_t layer = -1;
};

class CudaBackend final : public ModelBackend {
 public:
  CudaBackend(const Model& m, const BackendOptions& opt, std::unique_ptr<cuda::DevModel> dm = nullptr,
              cuda::OpTimer* timer = nullptr);
  ~CudaBackend() override;
  Device device() const override { return Device::CUDA; }
  void reserve(const CacheShape& shape) override;
  size_t reserve_bytes(const CacheShape& shape) const override;  // cuda_reserve.cu
  size_t reserve_budget() const override;
  const CacheShape& shape() const override { return shape_; }
  size_t bytes_per_slot(const CacheShape& shape) const override;
  int64_t slot_pos(int32_t slot) const override;
  void reset_slot(int32_t slot) override;
  void copy_slot(int32_t from, int32_t to) override;
  void step(const Batch& batch, float* logits_out) override;
  int64_t undo_token_limit() const override { return undo_.token_limit(); }
  void rollback_slot(int32_t slot, int64_t pos) override;
  std::vector<uint8_t> slot_state(int32_t slot) const override;
  bool samples_on_device() const override { return m_.config.vocab_size <= sample_rows_cuda_max_vocab(); }
  void sample_last_step(const StepSampling& s) override;
  int64_t max_sample_rows() const override { return sample_.rows; }
  bool has_mtp() const override { return dm_->mtp != nullptr; }
  // Expert-parallel ranks (BackendOptions::ep_comm; 1 = every routed expert on this GPU).
  int ep_ranks() const { return opt_.ep_comm ? opt_.ep_comm->size() : 1; }
  // The MoE exchanges routed-expert rows over a device communicator (any rank count: one NCCL or
  // DeviceComm rank runs the same path, its all-reduce then a copy).
  bool ep_exchange() const { return opt_.ep_comm && opt_.ep_comm->stream_ordered(); }
  void draft(const DraftRequest& r) override;  // cuda_mtp_block.cu
  size_t host_copies() const { return obs_.host_copies(); }

 private:
  // Activations for max_step_tokens rows (N), all device buffers.
  struct Act {
    DeviceBuffer plan;  // int32 [4N]: token, pos, slot, logit rows
    // x: the hc streams after each layer; x_alt: after a layer's attention half (the fused hc_post
    // writes out of place, hc_post_mix_cuda), then the head's gathered rows. normed_bf, qr_bf: the
    // bf16 copies of normed and qr that their norms write for the FP8/NVFP4 linears (a row is cast
    // once, not once per linear).
    // normed_ffn, out_ffn: the MoE half's input and output (the attention half's normed and out stay
    // as noted until the layer's one non-finite count, flush_counts).
    DeviceBuffer x, x_alt, normed, normed_ffn, normed_bf, out, out_ffn, post, comb;
    // u_bf, h_bf: wo_a's and the experts' SwiGLU outputs in bf16 when the next linear is FP8/NVFP4.
    DeviceBuffer qr, qr_bf, qf, q_bf, kvf, kv_bf, o_bf, u, u_bf, h_bf;
    DeviceBuffer ckv, cgate, ikv, igate, iqf, iq_bf, iw, iscore, sel, sel_score;
    DeviceBuffer router, eidx, ew, we, g, up, ey, routed, sy, hc_part;
    DeviceBuffer final_y, logits, cast, counts;
    DeviceBuffer attn_ws;  // f32 partials of split (decode) attention; see attention_sink_cuda
    DeviceBuffer sample;   // sample_last_step's arrays (SampleStage), mirrored by the pinned sample_host_
    // With an MTP block (cuda_mtp_block.cu): the block's input streams (last-layer rows gathered, or the
    // previous pass's output) f32 [N, hc, D], the embedding rows and e_proj's f32 [N, D], the bf16 copy
    // of the normed rows for a quantized e_proj/h_proj [N·hc, D], and draft()'s arrays (DraftStage).
    DeviceBuffer mtp_x, mtp_emb, mtp_e, mtp_bf, draft;
  };
  // Where draft()'s arrays sit in act_.draft and in draft_host_ (byte offsets), for S slots.
  struct DraftStage {
    size_t params = 0, tok = 0, pos = 0, slot = 0, src = 0, status = 0, lp = 0, pass = 0, out = 0, out_status = 0,
           spans = 0, save = 0, bytes = 0;
  };
  static DraftStage draft_stage(int64_t slots, int64_t hd);
  // draft() on the device for n rows and k passes, after the window rows are saved: gather the hidden
  // rows, k passes, put the rows back (graph-capturable).
  void draft_body(int64_t n, int64_t k, int64_t n_spans);
  // Where sample_last_step's arrays sit in act_.sample and sample_host_ (byte offsets), for
  // max_slots rows and V-bit masks.
  struct SampleStage {
    size_t params = 0, offsets = 0, adj = 0, mask = 0, token = 0, logprob = 0, status = 0, top_id = 0, top_lp = 0,
           bytes = 0;
    int64_t rows = 0, mask_words = 0;
  };
  static SampleStage sample_stage(int64_t rows, int64_t vocab);

  void check_slot(int32_t slot, const char* what) const;
  // What a reservation of `shape` allocates (cuda_reserve.cu): every activation buffer of `a` with its
  // bytes, the state and undo-log bytes, the MoE scratch; reserve() allocates exactly these.
  struct Want {
    DeviceBuffer* buf;
    int64_t bytes;
  };
  struct Reservation {
    std::vector<Want> wants;
    size_t act_bytes = 0, state_bytes = 0, undo_log_bytes = 0, undo_span_bytes = 0, moe_bytes = 0, max_notes = 0;
    StateLayout layout;
    UndoBook undo;
    SampleStage stage;
    DraftStage dstage;
    const cuda::DevLayer* packed = nullptr;  // a layer with packed experts (the MoE scratch's shape)
    size_t total() const { return act_bytes + state_bytes + moe_bytes; }
  };
  Reservation plan_reservation(const CacheShape& shape, Act& a) const;
  // Layer L (the MTP block's when L = num_layers): its weights and attention kind.
  const cuda::DevLayer& dev_layer(int64_t L) const {
    return L < m_.config.num_layers ? dm_->layers[size_t(L)] : dm_->mtp->block;
  }
  AttnKind attn_kind(int64_t L) const {
    return L < m_.config.num_layers ? m_.config.attn_kinds[size_t(L)] : AttnKind::SLIDING;
  }
  // One layer over act_.x (x_alt its scratch): partials_ready when the previous hc_post computed this
  // layer's hc_pre partial sums; next: the layer whose partial sums the last hc_post computes (or null).
  void layer_forward(int64_t L, int64_t n, int64_t max_pos, bool partials_ready, const cuda::DevLayer* next);
  void attention(int64_t L, int64_t n, int64_t max_pos);
  // A layer's independent branch (cuda_backend.cu): f runs with ctx_ pointing at the side stream's
  // Context, ordered after everything launched on the main stream so far; join_side() makes the main
  // stream wait for all of it. f must use *ctx_ (not a Context& taken before the call) and write only
  // buffers the main stream leaves alone until the join. Without branches (the option off, an observer or
  // the per-op timer watching the kernels, a step of more than kGraphMaxRows rows) f runs in place.
  template <class F>
  void on_side(int64_t n, F&& f);
  void join_side();
  bool branches(int64_t n) const;
  void moe(int64_t L, int64_t n);
  void expert(const cuda::DevExpert& e, const float* x, const uint16_t* x_bf, int64_t n, float* y);
  void linear(const DevLinear& w, const void* x, bool x_bf16, int64_t M, void* y, int64_t ldx = 0,
              int64_t ldy = 0);
  // Two linears of one bf16 input in one launch (run_linear_pair), timed as the op `label`; false, launching
  // nothing, when they do not pair (the caller runs them apart).
  bool linear_pair(const char* label, const DevLinear& a, const DevLinear& b, const uint16_t* x_bf, int64_t M,
                   float* ya, float* yb);
  // A linear over f32 rows x [M, K] that come with their bf16 copy xb: the FP8/NVFP4 linears read
  // xb (the bits their own cast would make), the dense ones x.
  void linear2(const DevLinear& w, const float* x, const uint16_t* xb, int64_t M, void* y) {
    if (w.wants_bf16_input())
      linear(w, xb, true, M, y);
    else
      linear(w, x, false, M, y);
  }
  // The named intermediates (cuda_backend_notes.cu): note() queues `what` of layer L ([n, width] rows,
  // inner: a row's shape) for the non-finite count and hands its rows to the observer; flush_counts
  // counts the queued ones in one launch; observe_entries hands the observer the compressed entries a
  // step completed; first_non_finite names the first noted intermediate with a non-finite row.
  void note(const char* what, int64_t layer, const void* data, bool bf16, int64_t width,
            const std::vector<int64_t>& inner);
  void observe_entries(int64_t L, const CompressorStateView& comp, const CompressorStateView* index);
  std::string first_non_finite();
  void flush_counts();
  // Every kernel of a step from the embedding to the LM head (no host synchronisation): run eagerly,
  // or captured into a graph by run_graph. max_pos bounds the indexer's grid (kernels also bound
  // each row by its own position, so a larger value changes no result).
  // n_mtp: the MTP block's catch-up rows (mtp_plan).
  void forward(int64_t n, int64_t R, int64_t max_pos, int64_t n_mtp);
  // Replays (capturing on first use) the graph of a step with n rows, R logits rows and n_mtp MTP rows;
  // false when kMaxGraphs other shapes are kept already (the caller runs the step eagerly).
  bool run_graph(int64_t n, int64_t R, int64_t n_mtp);
  // The MTP block (cuda_mtp_block.cu). mtp_plan: the step's catch-up rows into the plan's MTP part (the
  // CPU backend's mtp_catch_up rows), returns their count; mtp_catch_up: the hidden ring and the block's
  // window rows of a step (inside forward); mtp_input: the block's input streams x_in [n, hc, D];
  // draft_pass: one pass of draft() over its n rows (graph-capturable).
  int64_t mtp_plan(const Batch& b);
  void mtp_catch_up(int64_t n, int64_t n_mtp);
  void mtp_input(int64_t n, const int32_t* tok, const float* streams, float* x_in);
  void draft_pass(int64_t n);
  // draft_body as a graph captured once per (n, k); false: run it eagerly.
  bool run_draft_graph(int64_t n, int64_t k);
  void clear_graphs();

  const Model& m_;
  BackendOptions opt_;
  std::unique_ptr<Context> ctx_;
  // The side stream of on_side: its own Context (split-K workspace, cuBLAS handle; null when
  // BackendOptions::concurrent_branches is off), the fork and join events, and whether work was forked
  // since the last join.
  std::unique_ptr<Context> side_ctx_;
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
  bool side_open_ = false;
  size_t ctx_bytes() const { return ctx_->device_bytes() + (side_ctx_ ? side_ctx_->device_bytes() : 0); }
  std::unique_ptr<cuda::DevModel> dm_;
  std::unique_ptr<cuda::MoeScratch> moe_scratch_;
  CacheShape shape_{0, 0, 0};
  StateLayout layout_;
  DeviceBuffer state_;
  std::vector<LayerState> layers_;
  std::vector<int64_t> pos_;
  Act act_;
  int32_t* plan_host_ = nullptr;  // pinned [4N]
  char* sample_host_ = nullptr;   // pinned [sample_.bytes]
  SampleStage sample_;
  int64_t last_logit_rows_ = 0;   // R of the last step (sample_last_step's rows)
  StepPlan plan_;
  std::vector<NoteTag> notes_;
  size_t max_notes_ = 0;
  cuda::NonFiniteBatch pending_counts_;  // noted, not yet counted (flush_counts)
  // Captured steps by (rows, logits rows), each with the notes its capture made (their names);
  // cleared by reserve() (a new reservation moves every buffer the graphs point to).
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    std::vector<NoteTag> notes;
  };
  std::map<std::tuple<int64_t, int64_t, int64_t>, StepGraph> graphs_;
  std::map<std::pair<int64_t, int64_t>, StepGraph> draft_graphs_;  // draft_body by (rows, passes)
  DraftStage draft_;
  char* draft_host_ = nullptr;  // pinned [draft_.bytes]: draft()'s uploads and downloads, laid out as act_.draft
  cuda::DeviceObserver obs_;  // the observer's path; every device-to-host copy
  cuda::OpTimer* timer_ = nullptr;
  int64_t n_ = 0;  // rows of the current step
  // rollback_slot (backend/undo_log.h): the book, the log's rows on the device [max_slots, per slot],
  // and the copies of one step or rollback as device spans [max_slots · copies per slot, 3].
  UndoBook undo_;
  DeviceBuffer undo_log_, undo_spans_;
  std::vector<UndoCopy> undo_copies_;
  // Pinned staging of the span tables (a pageable upload would wait for the stream): the first half for a
  // step's table, the second for rollbacks' (rollback_used_ entries taken since the last step).
  int64_t* undo_host_ = nullptr;
  size_t undo_host_entries_ = 0, rollback_used_ = 0;
  void undo_copy(bool to_log);  // undo_copies_ on the stream: state → log (to_log) or back
  const int32_t *d_token_ = nullptr, *d_pos_ = nullptr, *d_slot_ = nullptr, *d_rows_ = nullptr;
  // The plan's MTP part [5N] (mtp_plan): the catch-up rows' token, position, slot, source (a batch row,
  // or −1 − a hidden-ring row) and each batch row's hidden-ring row (−1: none).
  const int32_t *d_mtok_ = nullptr, *d_mpos_ = nullptr, *d_mslot_ = nullptr, *d_msrc_ = nullptr, *d_rdst_ = nullptr;
};

// What body launches on the stream, captured and instantiated (cuda_backend.cu); when body throws, the
// capture ends (the stream stays usable) and the error is rethrown.
cudaGraphExec_t capture_graph(cudaStream_t st, const std::function<void()>& body);

template <typename T>
inline T* P(const DeviceBuffer& b) {
  return b.as<T>();
}

inline HcParams hc_params(const Config& c, const cuda::DevF32& fn, const cuda::DevF32& base, const cuda::DevF32& scale) {
  return HcParams{fn.p(), base.p(), scale.p(), c.hc_mult, c.hidden_size, c.hc_sinkhorn_iters, c.hc_eps,
                  c.rms_norm_eps};
}

// "l<L>.s<slot>.<what>" (layer < 0: "s<slot>.<what>"), the CPU backend's names.
inline std::string note_name(const char* what, int64_t layer, int32_t slot) {
  return layer >= 0 ? cuda::strf("l%lld.s%d.%s", (long long)layer, slot, what) : cuda::strf("s%d.%s", slot, what);
}

using cuda::gib;

// Device memory for the Context's workspaces and the CUDA runtime, counted when the weights load
// (before the Context exists); reserve() counts the Context's real bytes.
constexpr size_t kWorkingBytes = size_t(256) << 20;

// Steps of up to kGraphMaxRows rows run as CUDA graphs (decode batches and short prefill chunks: the
// launches of a ~1,500-kernel step cost more than the kernels at small batches); at most kMaxGraphs
// distinct (rows, logits rows) shapes are kept, further shapes run eagerly.
using cuda::kGraphMaxRows;
constexpr size_t kMaxGraphs = 64;

template <class F>
void CudaBackend::on_side(int64_t n, F&& f) {
  if (!branches(n)) {
    f();
    return;
  }
  CM_CUDA(cudaEventRecord(fork_ev_, ctx_->stream()));
  CM_CUDA(cudaStreamWaitEvent(side_ctx_->stream(), fork_ev_, 0));
  side_open_ = true;
  // ctx_ is the side's while f runs, and the main stream's again however f ends.
  struct Swap {
    std::unique_ptr<Context>&a, &b;
    Swap(std::unique_ptr<Context>& x, std::unique_ptr<Context>& y) : a(x), b(y) { std::swap(a, b); }
    ~Swap() { std::swap(a, b); }
  } swap(ctx_, side_ctx_);
  f();
}

// A linear's op label: its name without the "layers.<L>." prefix ("attn.wq_a"), a pointer into the name.
inline const char* op_label(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return name.c_str();
  const size_t dot = name.find('.', 7);
  return dot == std::string::npos ? name.c_str() : name.c_str() + dot + 1;
}


}  // namespace cm
