#include "model/dummy.h"

#include <unistd.h>

#include <algorithm>

#include "common/error.h"
#include "model/synthetic.h"

namespace cm {

Config keep_first_layers(Config c, int64_t n) {
  if (n == 0) return c;
  if (n < 0 || n > c.num_layers)
    fail("--num-layers {} is outside [1, {}] (the layers of the config)", n, c.num_layers);
  c.num_layers = n;
  c.attn_kinds.resize(size_t(n));
  if (!c.layer_ratios.empty()) c.layer_ratios.resize(size_t(n));
  c.moe_kinds.resize(size_t(n));
  for (int64_t L = 0; L < n; ++L)  // hca_ratio: the first kept HCA layer's, as config_from_json sets it
    if (c.attn_kinds[size_t(L)] == AttnKind::HCA) {
      c.hca_ratio = c.ratio(L);
      break;
    }
  return c;
}

size_t dummy_host_bytes(const Config& c) {
  const double D = double(c.hidden_size), I = double(c.moe_inter), E = double(c.n_routed_experts);
  const double H = double(c.num_heads), hd = double(c.head_dim), ql = double(c.q_lora_rank);
  const double G = double(c.o_groups), ol = double(c.o_lora_rank), V = double(c.vocab_size);
  const double experts = E * 3 * D * I * (0.5 + 1.0 / 16);                            // NVFP4 + E4M3 scales
  const double fp8 = D * ql + ql * H * hd + hd * D + H * hd * ol + G * ol * D + 3 * D * I;  // + shared expert
  const double bf16 = 2 * (E * D + 4 * 2 * hd * D + double(c.index_n_heads) * D);         // router, compressors
  return size_t((experts + fp8 + bf16) * double(c.num_layers) + 2 * V * D * 2);
}

std::unique_ptr<Model> dummy_model(const Config& c, bool host_weights, uint64_t seed) {
  auto m = synthetic_model_shell(c);
  if (!host_weights) return m;
  const size_t need = dummy_host_bytes(c);
  const size_t have = size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE));
  if (double(need) > 0.8 * double(have))
    fail("dummy weights for {} layers need about {:.1f} GB of host memory, {:.1f} GB here: keep fewer layers "
         "(--num-layers) or generate them on the GPU (--device cuda)",
         c.num_layers, double(need) / 1e9, double(have) / 1e9);
  m->weights = synthetic_globals(c, seed);
  for (int64_t L = 0; L < c.num_layers; ++L) m->weights.layers.push_back(synthetic_layer(c, L, seed, true));
  return m;
}

}  // namespace cm
