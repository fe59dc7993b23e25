// Linear weight resolution and per-linear checks; see load_linear.h.
#include "quant/load_linear.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <regex>

#include "common/error.h"
#include "common/numeric.h"

namespace cm {

namespace {

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }
bool is_packed(DType t) { return t == DType::U8 || t == DType::I8; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The scale tensor of an FP8 block weight: `.scale` (release) or
// `.weight_scale_inv` (HF's FP8 quantizer; a multiplier despite its name).
const TensorView* fp8_scale(const TensorStore& store, const std::string& prefix) {
  const TensorView* s = store.find(prefix + ".scale");
  return s ? s : store.find(prefix + ".weight_scale_inv");
}

// A scalar F32 tensor ([] or [1]); appends a problem and returns nullopt when bad.
std::optional<float> scalar_f32(const TensorView* t, std::vector<std::string>& out) {
  if (t->dtype != DType::F32) {
    out.push_back(fmt::format("tensor '{}' has dtype {}, expected F32 scalar", t->name, dtype_name(t->dtype)));
    return std::nullopt;
  }
  if (t->numel() != 1 || t->shape.size() > 1) {
    out.push_back(fmt::format("tensor '{}' has shape {}, expected a scalar []", t->name, t->shape_str()));
    return std::nullopt;
  }
  float v;
  std::memcpy(&v, t->data, 4);
  if (!std::isfinite(v) || v <= 0.0f) {
    out.push_back(fmt::format("tensor '{}' = {} is not finite and > 0", t->name, v));
    return std::nullopt;
  }
  return v;
}

void check_shape(const TensorView* t, std::vector<int64_t> want, std::vector<std::string>& out) {
  if (t->shape != want) {
    std::string w = "[";
    for (size_t i = 0; i < want.size(); ++i) w += (i ? ", " : "") + std::to_string(want[i]);
    out.push_back(fmt::format("tensor '{}' has shape {}, expected {}]", t->name, t->shape_str(), w));
  }
}

// Value scans, one line per tensor with the count and the first bad index.
void scan_e4m3(const TensorView* t, bool reject_negative, std::vector<std::string>& out) {
  int64_t nan = 0, neg = 0, first = -1;
  for (size_t i = 0; i < t->nbytes; ++i) {
    uint8_t b = t->data[i];
    bool bad_nan = e4m3_is_nan(b), bad_neg = reject_negative && !bad_nan && (b & 0x80) && (b & 0x7f);
    nan += bad_nan;
    neg += bad_neg;
    if ((bad_nan || bad_neg) && first < 0) first = int64_t(i);
  }
  if (nan) out.push_back(fmt::format("tensor '{}' holds {} E4M3 NaN code(s) (first at element {})", t->name, nan, first));
  if (neg) out.push_back(fmt::format("tensor '{}' holds {} negative block scale(s) (first at element {})", t->name, neg, first));
}
void scan_e8m0(const TensorView* t, std::vector<std::string>& out) {
  int64_t nan = 0, first = -1;
  for (size_t i = 0; i < t->nbytes; ++i)
    if (t->data[i] == 0xff && nan++ == 0) first = int64_t(i);
  if (nan) out.push_back(fmt::format("tensor '{}' holds {} E8M0 NaN code(s) 0xFF (first at element {})", t->name, nan, first));
}
// Float-format weights (F32/BF16/F16): every value must be finite (a NaN or
// Inf weight would reach the logits silently).
void scan_float_finite(const TensorView* t, std::vector<std::string>& out) {
  const int64_t n = t->numel();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    bool finite;
    if (t->dtype == DType::F32) {
      uint32_t u;
      std::memcpy(&u, t->data + 4 * i, 4);
      finite = (u & 0x7f800000u) != 0x7f800000u;
    } else {
      const uint16_t u = uint16_t(t->data[2 * i] | (t->data[2 * i + 1] << 8));
      finite = t->dtype == DType::BF16 ? (u & 0x7f80u) != 0x7f80u : (u & 0x7c00u) != 0x7c00u;
    }
    if (!finite && bad++ == 0) first = i;
  }
  if (bad)
    out.push_back(fmt::format("tensor '{}' holds {} non-finite value(s) (NaN or Inf; first at element {})", t->name,
                              bad, first));
}

void scan_f32_positive(const TensorView* t, std::vector<std::string>& out) {
  int64_t bad = 0, first = -1;
  const int64_t n = t->numel();
  for (int64_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, t->data + i * 4, 4);
    if ((!std::isfinite(v) || v <= 0.0f) && bad++ == 0) first = i;
  }
  if (bad) out.push_back(fmt::format("tensor '{}' holds {} scale(s) that are not finite and > 0 (first at element {})", t->name, bad, first));
}

}  // namespace

bool has_linear(const TensorStore& store, const std::string& prefix) { return store.find(prefix + ".weight") != nullptr; }

bool parse_expert_name(const std::string& prefix, ExpertName* out) {
  static const std::regex re(R"(^(.*\.experts)\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)$)");
  static const std::regex layer_re(R"((?:^|\.)layers\.(\d+)\.)");
  std::smatch m;
  if (!std::regex_match(prefix, m, re)) return false;
  out->base = m[1];
  out->expert = std::stoll(m[2]);
  out->proj = m[3];
  std::smatch lm;
  out->layer = std::regex_search(out->base, lm, layer_re) ? std::stoll(lm[1]) : -1;
  return true;
}

std::optional<WeightFormat> stored_linear_format(const TensorStore& store, const std::string& prefix) {
  const TensorView* w = store.find(prefix + ".weight");
  if (!w) return std::nullopt;
  switch (w->dtype) {
    case DType::F32: return WeightFormat::F32;
    case DType::BF16: return WeightFormat::BF16;
    case DType::F16: return WeightFormat::F16;
    case DType::F8_E4M3:
      if (fp8_scale(store, prefix)) return WeightFormat::FP8_BLOCK;
      return std::nullopt;
    case DType::U8:
    case DType::I8:
      if (store.find(prefix + ".weight_scale")) return WeightFormat::NVFP4;
      if (store.find(prefix + ".scale")) return WeightFormat::MXFP4;
      return std::nullopt;
    default: return std::nullopt;
  }
}

// Projection kinds that see the same input: w1/w3 (gate/up) and w2 (down).
static bool same_input(const std::string& a, const std::string& b) {
  auto kind = [](const std::string& p) { return (p == "w2" || p == "down_proj") ? 1 : 0; };
  return kind(a) == kind(b);
}

std::optional<float> derive_input_scale(const TensorStore& store, const std::string& prefix) {
  ExpertName me;
  if (!parse_expert_name(prefix, &me)) return std::nullopt;
  std::optional<float> best;
  const std::string head = me.base + ".";
  const auto& all = store.all();
  for (auto it = all.lower_bound(head); it != all.end() && it->first.compare(0, head.size(), head) == 0; ++it) {
    const std::string& name = it->first;
    static const std::string suffix = ".input_scale";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    ExpertName other;
    if (!parse_expert_name(name.substr(0, name.size() - suffix.size()), &other) || other.base != me.base) continue;
    if (other.expert == me.expert || !same_input(other.proj, me.proj)) continue;
    const TensorView* t = it->second;
    if (t->dtype != DType::F32 || t->numel() != 1) continue;
    float v;
    std::memcpy(&v, t->data, 4);
    if (std::isfinite(v) && v > 0.0f && (!best || v > *best)) best = v;
  }
  return best;
}

std::vector<std::string> linear_problems(const TensorStore& store, const std::string& prefix, int64_t n, int64_t k,
                                         const LinearLoadOptions& opt, bool scan_values) {
  std::vector<std::string> out;
  const std::string wname = prefix + ".weight";
  const TensorView* w = store.find(wname);
  if (!w) {
    out.push_back(n >= 0 ? fmt::format("missing tensor '{}' (expected shape [{}, {}])", wname, n, k)
                         : fmt::format("missing tensor '{}'", wname));
    return out;
  }
  if (w->shape.size() != 2) {
    out.push_back(fmt::format("tensor '{}' has shape {}, expected a 2-D [out, in] weight", wname, w->shape_str()));
    return out;
  }
  const bool packed = is_packed(w->dtype);
  if (n < 0) {
    n = w->shape[0];
    k = packed ? w->shape[1] * 2 : w->shape[1];
  }
  const TensorView* s_mx = store.find(prefix + ".scale");
  const TensorView* s_inv = store.find(prefix + ".weight_scale_inv");
  const TensorView* s_nv = store.find(prefix + ".weight_scale");
  const TensorView* s2 = store.find(prefix + ".weight_scale_2");
  const TensorView* in_s = store.find(prefix + ".input_scale");

  if (is_float(w->dtype)) {
    check_shape(w, {n, k}, out);
    if (scan_values) scan_float_finite(w, out);
    for (const TensorView* s : {s_mx, s_inv, s_nv, s2})
      if (s) out.push_back(fmt::format("tensor '{}' is a scale but '{}' is {} (not quantized)", s->name, wname, dtype_name(w->dtype)));
    return out;
  }
  if (w->dtype == DType::F8_E4M3) {
    check_shape(w, {n, k}, out);
    if (s_mx && s_inv) out.push_back(fmt::format("tensors '{}' and '{}' both present; expected one block scale", s_mx->name, s_inv->name));
    const TensorView* s = s_mx ? s_mx : s_inv;
    if (!s) {
      out.push_back(fmt::format("FP8 weight '{}' has no block scale ('{}.scale' or '{}.weight_scale_inv')", wname, prefix, prefix));
    } else if (s->dtype != DType::F8_E8M0 && s->dtype != DType::F32) {
      out.push_back(fmt::format("tensor '{}' has dtype {}, expected F8_E8M0 or F32 block scales", s->name, dtype_name(s->dtype)));
    } else {
      check_shape(s, {ceil_div(n, 128), ceil_div(k, 128)}, out);
      if (scan_values) s->dtype == DType::F32 ? scan_f32_positive(s, out) : scan_e8m0(s, out);
    }
    if (s_nv) out.push_back(fmt::format("tensor '{}': per-tensor FP8 scales are not a supported format", s_nv->name));
    if (scan_values) scan_e4m3(w, false, out);
    return out;
  }
  if (!packed) {
    out.push_back(fmt::format("tensor '{}' has dtype {}, not a linear weight format", wname, dtype_name(w->dtype)));
    return out;
  }
  check_shape(w, {n, k / 2}, out);
  if (s_nv) {  // NVFP4
    if (s_mx) out.push_back(fmt::format("tensors '{}' and '{}' both present; NVFP4 or MXFP4?", s_nv->name, s_mx->name));
    if (k % 16) out.push_back(fmt::format("NVFP4 weight '{}': in_features {} is not a multiple of 16", wname, k));
    if (s_nv->dtype != DType::F8_E4M3)
      out.push_back(fmt::format("tensor '{}' has dtype {}, expected F8_E4M3", s_nv->name, dtype_name(s_nv->dtype)));
    else {
      check_shape(s_nv, {n, k / 16}, out);
      if (scan_values) scan_e4m3(s_nv, true, out);
    }
    if (!s2) out.push_back(fmt::format("NVFP4 weight '{}' has no '{}.weight_scale_2'", wname, prefix));
    else scalar_f32(s2, out);
    if (in_s) {
      scalar_f32(in_s, out);
    } else {
      ExpertName e;
      bool expert = parse_expert_name(prefix, &e);
      std::string what = expert ? fmt::format(" (layer {} expert {} {})", e.layer, e.expert, e.proj) : "";
      if (!opt.allow_missing_input_scale)
        out.push_back(fmt::format("missing tensor '{}.input_scale'{}: NVFP4 needs its activation scale{}", prefix, what,
                                  expert ? "; --derive-input-scale derives it from the layer's other experts" : ""));
      else if (!derive_input_scale(store, prefix))
        out.push_back(fmt::format("missing tensor '{}.input_scale'{}: no other {} of the same projection kind stores one to derive it from",
                                  prefix, what, expert ? "expert of the layer" : "linear"));
    }
    return out;
  }
  if (s_mx) {  // MXFP4
    if (k % 32) out.push_back(fmt::format("MXFP4 weight '{}': in_features {} is not a multiple of 32", wname, k));
    if (s_mx->dtype != DType::F8_E8M0)
      out.push_back(fmt::format("tensor '{}' has dtype {}, expected F8_E8M0", s_mx->name, dtype_name(s_mx->dtype)));
    else {
      check_shape(s_mx, {n, k / 32}, out);
      if (scan_values) scan_e8m0(s_mx, out);
    }
    for (const TensorView* s : {s2, in_s, s_inv})
      if (s) out.push_back(fmt::format("tensor '{}' does not belong to an MXFP4 weight (scale '{}.scale' is E8M0 per 32)", s->name, prefix));
    return out;
  }
  out.push_back(fmt::format("packed FP4 weight '{}' ({}) has no scales ('{}.weight_scale' for NVFP4 or '{}.scale' for MXFP4)",
                            wname, dtype_name(w->dtype), prefix, prefix));
  return out;
}

LinearWeight load_linear(const TensorStore& store, const std::string& prefix, int64_t n, int64_t k,
                         const LinearLoadOptions& opt) {
  std::vector<std::string> problems = linear_problems(store, prefix, n, k, opt, false);
  if (!problems.empty()) {
    std::string msg = problems[0];
    for (size_t i = 1; i < problems.size(); ++i) msg += "; " + problems[i];
    throw Error(msg);
  }
  std::optional<WeightFormat> f = stored_linear_format(store, prefix);
  CM_CHECK(f.has_value(), "linear '{}': unknown stored format", prefix);  // excluded by linear_problems
  const TensorView* t = store.find(prefix + ".weight");
  LinearWeight w;
  w.name = prefix;
  w.format = *f;
  w.out_features = n;
  w.in_features = k;
  w.data = t->data;
  const TensorView* s = nullptr;
  switch (*f) {
    case WeightFormat::F32:
    case WeightFormat::BF16:
    case WeightFormat::F16: return w;
    case WeightFormat::FP8_BLOCK: s = fp8_scale(store, prefix); break;
    case WeightFormat::MXFP4: s = store.find(prefix + ".scale"); break;
    case WeightFormat::NVFP4: {
      s = store.find(prefix + ".weight_scale");
      std::memcpy(&w.scale_2, store.find(prefix + ".weight_scale_2")->data, 4);
      if (const TensorView* in = store.find(prefix + ".input_scale")) std::memcpy(&w.input_scale, in->data, 4);
      else w.input_scale = *derive_input_scale(store, prefix);  // present: checked by linear_problems
      break;
    }
  }
  w.scale = s->data;
  w.scale_dtype = s->dtype;
  w.scale_rows = s->shape[0];
  w.scale_cols = s->shape[1];
  return w;
}

}  // namespace cm
