#include "model/state.h"

namespace cm {

State state_new(const Config& cfg) {
  State s;
  s.layers.resize(size_t(cfg.num_layers));
  for (int64_t L = 0; L < cfg.num_layers; ++L) {
    AttnKind k = cfg.attn_kinds[size_t(L)];
    LayerState& ls = s.layers[size_t(L)];
    if (k != AttnKind::SLIDING) ls.comp.width = (k == AttnKind::CSA ? 2 : 1) * cfg.head_dim;
    if (k == AttnKind::CSA) ls.index_comp.width = 2 * cfg.index_head_dim;
  }
  return s;
}

static void reset_comp(CompressorState& c) {
  int64_t w = c.width;
  c = CompressorState{};
  c.width = w;
}

void state_reset(State& s) {
  s.pos = 0;
  for (auto& l : s.layers) {
    l.window.clear();
    l.n_window = 0;
    reset_comp(l.comp);
    reset_comp(l.index_comp);
  }
}

}  // namespace cm
