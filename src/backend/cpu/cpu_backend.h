// The CPU backend: DeepSeek-V4 in fp32 behind the engine seam (seam/backend.h),
// the reference every other backend is tested against.
//
// Per-slot state is the layout both backends share (backend/step_plan.h: window ring, the
// compressors' pending rings and entries, the indexer keys), in f32, in one buffer sized by
// reserve(). The only counter is the slot's position: pending rows = pos mod m, entries =
// pos / m, so nothing else needs to be kept in step with the schedule.
//
// Activations and scratch for max_step_tokens rows are preallocated too; a
// step allocates nothing. cpu_backend.cpp holds the step top to bottom,
// attention_block.cpp and moe_block.cpp the two blocks.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "backend/step_plan.h"
#include "backend/undo_log.h"
#include "model/model.h"
#include "seam/backend.h"

namespace cm {

// One compressor of one slot: views into the state buffer (backend/step_plan.h's layout).
struct CompressorSlot {
  float* pend_kv = nullptr;    // [c·m, c·dc]   row of position p at p mod c·m (c = 2 CSA, 1 HCA)
  float* pend_gate = nullptr;  // [c·m, c·dc]   raw gates (ape is added when a block is pooled)
  float* entries = nullptr;    // [max(1, max_ctx/m), dc]
};

// One layer of one slot.
struct LayerSlot {
  float* window = nullptr;  // [W, hd]
  CompressorSlot comp;      // CSA/HCA layers
  CompressorSlot index;     // CSA layers: indexer keys
};

// Everything a step computes, [max_step_tokens, ...] unless noted (fp32).
struct CpuActivations {
  std::vector<float> x;           // [N, hc, D] residual streams
  std::vector<float> a, normed, out;  // [N, D]
  std::vector<float> post, comb;  // [N, hc], [N, hc, hc]
  std::vector<float> hc_scratch;  // hc_pre / hc_head scratch
  std::vector<float> qr;          // [N, ql]
  std::vector<float> q;           // [N, H·hd]
  std::vector<float> kv;          // [N, hd]
  std::vector<float> o;           // [N, H·hd]  attention output (inverse-RoPE'd)
  std::vector<float> u;           // [N, G·ol]  grouped wo_a output
  std::vector<float> ckv, cgate;  // [N, 2·hd]  compressor projections
  std::vector<float> ikv, igate;  // [N, 2·ihd] indexer compressor projections
  std::vector<float> iq;          // [N, inh·ihd] indexer queries
  std::vector<float> iw;          // [N, inh]   indexer head weights
  std::vector<int32_t> sel;       // [N, topk]  indexer choice per token
  std::vector<int32_t> n_sel;     // [N]
  std::vector<float> sel_score;   // [N, topk]  scores of the chosen entries (observed)
  std::vector<float> router;      // [N, E]
  std::vector<int32_t> eidx;      // [N, K]     routed expert ids (global)
  std::vector<float> ew;          // [N, K]     routing weights
  std::vector<int32_t> ecount, estart;  // [E], [E+1]
  std::vector<int32_t> erow;      // [N·K]      batch row of each (expert, slot) pair, grouped by expert
  std::vector<float> eweight;     // [N·K]
  std::vector<float> xs;          // [N·K, D]   gathered expert inputs
  std::vector<float> g, up;       // [N·K, I]
  std::vector<float> y;           // [N·K, D]
  std::vector<float> routed;      // [N, D]     Σ routed experts (observed)
  // Expert parallelism (sized only when BackendOptions::ep_comm has > 1 rank): this rank's
  // "home" rows send their (row, expert) pairs to the experts' owners and get y back.
  struct Ep {
    std::vector<int32_t> send_n, recv_n;            // [R] pairs to / from each rank (exchanged)
    std::vector<int64_t> send_c, recv_c, gather_n;  // [R] the same as counts; routed floats per rank
    std::vector<int64_t> send_f, recv_f, ones;      // [R] floats to / from each rank; 1s
    std::vector<int32_t> slot_of_pair;  // [N·K] home pair (t, j) -> its position in the send order
    std::vector<float> send_x, recv_x;  // [N·K, D] rows going out / coming in
    std::vector<int32_t> send_e, recv_e;  // [N·K] global expert of each pair
    std::vector<float> recv_y, back_y;  // [N·K, D] owner's results / results back home
    std::vector<int32_t> recv_pos;      // [N·K] received pairs grouped by local expert
  } ep;
  std::vector<float> head_in;     // [N, hc, D] rows whose logits are wanted
  std::vector<float> final_y;     // [N, D]
  // The MTP block (sized when the model has one): its input streams, the streams it reads, the
  // embedded tokens, a draft step's rows, the window rows a draft puts back, its logits.
  std::vector<float> mtp_in, mtp_x;        // [N, hc, D]
  std::vector<float> mtp_e, mtp_hn;        // [N, D], [N·hc, D]
  std::vector<int32_t> mtp_tok, mtp_pos, mtp_slot;  // [N] catch-up or draft rows
  std::vector<uint8_t> mtp_want;           // [N]
  std::vector<float> draft_save;           // [max_slots · kMaxDraft, hd]
  std::vector<float> draft_logits;         // [max_slots, V]
  std::vector<int32_t> draft_status;       // [max_slots]
  std::vector<float> draft_lp;             // [max_slots]
  std::vector<float> pool_kv, pool_gate;  // [2·max_m, max_dc] one entry's pooling slots
  std::vector<float> entry;       // [max_dc]
  // Per OpenMP thread: attention and indexer scratch.
  struct Thread {
    std::vector<const float*> ent;   // [W + entries]  attention rows
    std::vector<float> scores;       // [H·(W + entries)]
    std::vector<float> iscore;       // [max indexer entries]
    std::vector<int32_t> itopk;      // [max indexer entries]
    std::vector<float> iscratch;     // [inh·kIndexerChunk]
    std::vector<const float*> irows; // [kIndexerChunk]
  };
  std::vector<Thread> threads;
};

class CpuBackend final : public ModelBackend {
 public:
  CpuBackend(const Model& m, const BackendOptions& opt);
  Device device() const override { return Device::CPU; }
  void reserve(const CacheShape& shape) override;
  const CacheShape& shape() const override { return shape_; }
  size_t bytes_per_slot(const CacheShape& shape) const override;
  int64_t slot_pos(int32_t slot) const override;
  void reset_slot(int32_t slot) override;
  void copy_slot(int32_t from, int32_t to) override;
  void step(const Batch& batch, float* logits_out) override;
  int64_t undo_token_limit() const override { return undo_.token_limit(); }
  void rollback_slot(int32_t slot, int64_t pos) override;
  std::vector<uint8_t> slot_state(int32_t slot) const override;
  bool has_mtp() const override { return !m_.weights.mtp.empty(); }
  void draft(const DraftRequest& r) override;
  // Layer L's weights and kind: the model's layers, then (L = num_layers) the MTP block.
  const LayerWeights& layer_weights(int64_t L) const {
    return L < m_.config.num_layers ? m_.weights.layers[size_t(L)] : m_.weights.mtp[0].block;
  }
  AttnKind layer_kind(int64_t L) const {
    return L < m_.config.num_layers ? m_.config.attn_kinds[size_t(L)] : AttnKind::SLIDING;
  }
  // The slot's hidden ring row of position p (MTP: the streams of the last layer).
  float* hidden_row(int32_t slot, int64_t p);
  // One step's rows (batch(), plan()) through layer L: X [n, hc, D] in place.
  void layer_forward(int64_t L, float* X, int64_t n);
  // The CPU backend samples "where the logits are" too (its own memory, the same sampler): step()
  // with logits_out = nullptr keeps the logits rows for sample_last_step().
  bool samples_on_device() const override { return true; }
  int64_t max_sample_rows() const override { return sample_rows_; }
  void sample_last_step(const StepSampling& s) override;

  // Named intermediates: the observer (if any) sees each slot's rows as
  // "l<L>.s<slot>.<what>"; the first non-finite one is remembered for the error.
  // (Shapes are initializer lists so that a step without an observer allocates nothing.)
  void note(const char* what, int64_t layer, const float* data, int64_t row_width,
            std::initializer_list<int64_t> inner);
  void note_slot(const char* what, int64_t layer, const Segment& s, const float* data, int64_t rows,
                 int64_t row_width, std::initializer_list<int64_t> inner);

  // y = x · W[row0 : row0+rows]ᵀ for m rows (x rows ldx apart, y rows ldy apart; 0 = dense)
  // with the backend's activation mode; the calibration observer sees x first.
  void linear(const LinearWeight& w, const float* x, int64_t m, float* y, int64_t ldx = 0, int64_t ldy = 0,
              int64_t row0 = 0, int64_t rows = -1);

  const Model& model() const { return m_; }
  const BackendOptions& options() const { return opt_; }
  const Batch& batch() const { return *batch_; }
  const StepPlan& plan() const { return plan_; }
  CpuActivations& act() { return act_; }
  // Slot s's state of layer L (views into the state buffer).
  LayerSlot layer_slot(int32_t s, int64_t L);
  int threads() const { return threads_; }

 private:
  void check_slot(int32_t slot, const char* what) const;
  void mtp_catch_up(const Batch& b);  // mtp_block.cpp: the block's window rows of a step, the hidden ring

  const Model& m_;
  BackendOptions opt_;
  CacheShape shape_{0, 0, 0};
  StateLayout layout_;
  std::vector<float> state_;  // layout_.bytes
  std::vector<int64_t> pos_;  // slot positions (tokens held)
  CpuActivations act_;
  StepPlan plan_;
  const Batch* batch_ = nullptr;
  int threads_ = 1;
  std::string first_bad_;  // first non-finite intermediate of the current step
  int64_t sample_rows_ = 0;               // max_sample_rows()
  std::vector<float> last_logits_;        // [sample_rows_, vocab]: a step's logits kept for sample_last_step
  int64_t last_rows_ = -1;                // logits rows of the last step (-1: none to sample)
  const float* last_out_ = nullptr;       // where the last step returned them (null: kept in last_logits_)
  std::vector<SampleAdjust> sample_adj_;  // sample_last_step's copy of the adjustments (the sampler writes them)
  std::vector<int32_t> sample_status_;    // [sample_rows_]
  UndoBook undo_;                         // rollback_slot's book of rows written by undoable steps
  std::vector<uint8_t> undo_log_;         // [max_slots, undo_.log_bytes_per_slot()] those rows' previous bytes
  std::vector<UndoCopy> undo_copies_;     // scratch: one step's or one rollback's copies
  Batch mtp_batch_;                       // the MTP block's rows while it runs (catch-up, draft)
};

// The two blocks of a layer over the step's rows (x: normed block input [n, D]).
void attention_block(CpuBackend& be, int64_t layer, const float* x, float* out);
void moe_block(CpuBackend& be, int64_t layer, const float* x, float* out);

// The shared K=V head's rows of a layer: RMSNorm(x·wkvᵀ), RoPE at pos (attention_block.cpp).
void attention_kv(CpuBackend& be, const LayerWeights& lw, const RopeTable& rope, const float* x, int64_t n,
                  const int32_t* pos, float* kv);
// X_in = e_proj(enorm(embed[tok])) in every stream + h_proj(hnorm(X)) per stream (mtp_block.cpp).
void mtp_input(CpuBackend& be, const int32_t* tok, const float* X, int64_t n, float* xin);

// Routing (spec'd in moe_block.cpp): for each row the K global expert ids and weights.
void moe_route(const Config& c, const LayerWeights& lw, const int32_t* tokens, const float* logits, int64_t T,
               int32_t* idx, float* weights);

// The CPU backend behind the seam (the factory's way to make one).
std::unique_ptr<ModelBackend> make_cpu_backend(const Model& m, const BackendOptions& opt);

}  // namespace cm
