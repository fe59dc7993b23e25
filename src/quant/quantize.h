// The NVFP4 quantizer behind `clawmine quantize` (spec §9.5): reads an F32,
// BF16, FP8-block or MXFP4 checkpoint and writes a sharded ModelOpt-format
// NVFP4 checkpoint. Each selected linear becomes
//   weight         U8 [N, K/2]   E2M1 RNE of w / (dec(s_b) * scale_2), low nibble = even k
//   weight_scale   F8_E4M3 [N, K/16]   e4m3_rn_satfinite(amax_b / 6 / scale_2)
//   weight_scale_2 F32 []        amax(W) / (6 * 448)
//   input_scale    F32 []        activation amax / (6 * 448)
// Everything else is copied byte for byte under its source name (the key
// spelling of the source is kept). A layer's routed experts share one
// input_scale per projection kind (w1/w3 together, w2 separately): the max
// over the layer's experts, so experts calibration never reached still get a
// valid scale. Without calibration every input_scale is default_input_amax /
// 2688 (reported on the log).
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace cm {

struct QuantizeOptions {
  std::string in_dir, out_dir;
  std::vector<std::string> include;  // extra modules to quantize (globs over module names)
  std::vector<std::string> exclude;  // modules to keep as stored (wins over everything)
  // Activation amax assumed where calibration gave none. 2688 = 6 * 448 makes
  // input_scale 1.0: block scales stay in E4M3's normal range for block amax
  // down to ~0.09 and saturate only above 2688.
  float default_input_amax = 2688.0f;
  int64_t shard_bytes = int64_t(2) << 30;  // target size of one output shard
};

struct QuantizeSummary {
  int64_t quantized = 0;          // linears written as NVFP4
  int64_t kept = 0;               // tensors copied as stored
  int64_t nvfp4_params = 0;       // weights quantized
  int64_t calibrated = 0;         // input_scales from calibration (incl. expert groups)
  int64_t defaulted = 0;          // input_scales from default_input_amax
  size_t bytes_in = 0, bytes_out = 0;
  int64_t shards = 0;
  std::vector<std::string> ignore;  // the quantization_config ignore list written
};

// Default selection: attention wq_a, wq_b, wkv, wo_a, wo_b, shared experts and
// routed experts of the main layers (not mtp.*), in release or transformers
// spelling; `model.` prefixes are ignored when matching.
bool quantize_default_target(const std::string& module);
// Default selection + include globs, minus exclude globs.
bool quantize_selected(const std::string& module, const std::vector<std::string>& include,
                       const std::vector<std::string>& exclude);

// Writes the quantized checkpoint. input_amax: calibrated activation amax per
// module name (as stored in the source), may be empty. Progress on log.
QuantizeSummary quantize_checkpoint(const QuantizeOptions& opt, const std::map<std::string, float>& input_amax,
                                    std::FILE* log);

}  // namespace cm
