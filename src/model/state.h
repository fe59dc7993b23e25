// Per-sequence decode state (spec §6, §15.7). Everything a sequence has seen
// that later tokens need: the sliding-window KV rows, each compressor's
// pending (not yet complete) block, the CSA overlap half of the last complete
// block, the compressed entries and indexer keys, and the position. A State
// belongs to one sequence; state_reset() clears it for the next one.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace cm {

// One compressor's running state (attention compressor, or the indexer's).
struct CompressorState {
  int64_t width = 0;             // c·dc channels of a projected row
  std::vector<float> pend_kv;    // [n_pend, width] rows of the incomplete block
  std::vector<float> pend_gate;  // [n_pend, width] gates with ape already added
  int64_t n_pend = 0;
  std::vector<float> prev_kv;    // CSA: [m, dc] A-halves of the last complete block
  std::vector<float> prev_gate;  // CSA: [m, dc]
  bool has_prev = false;
  std::vector<float> entries;    // [n_entries, dc] compressed entries (normed, RoPE'd)
  int64_t n_entries = 0;
};

struct LayerState {
  std::vector<float> window;  // [n_window, hd] KV rows of the last n_window positions (oldest first)
  int64_t n_window = 0;
  CompressorState comp;       // CSA/HCA
  CompressorState index_comp; // CSA: indexer keys
};

struct State {
  int64_t pos = 0;  // tokens consumed so far
  std::vector<LayerState> layers;
};

State state_new(const Config& cfg);
void state_reset(State& s);

}  // namespace cm
