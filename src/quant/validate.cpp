// Checkpoint-wide validation and the quantization_config check; see validate.h.
#include "quant/validate.h"

#include <fmt/format.h>

#include <set>

#include "common/error.h"

namespace cm {

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Suffixes of tensors that only exist next to a quantized linear weight.
const char* const kScaleSuffixes[] = {".weight_scale_inv", ".weight_scale_2", ".weight_scale", ".input_scale", ".scale"};

bool quantized_dtype(DType t) { return t == DType::F8_E4M3 || t == DType::U8 || t == DType::I8; }
bool float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// Linear prefixes of the checkpoint worth checking: quantized weights, 2-D
// float weights (scanned for NaN/Inf), and any weight that has a scale
// sibling (a float weight with scales is a problem).
std::set<std::string> linear_prefixes(const TensorStore& store, std::vector<std::string>& orphans) {
  std::set<std::string> out;
  for (const auto& [name, t] : store.all()) {
    if (ends_with(name, ".weight")) {
      if (quantized_dtype(t->dtype) || (float_dtype(t->dtype) && t->shape.size() == 2))
        out.insert(name.substr(0, name.size() - 7));
      continue;
    }
    for (const char* suf : kScaleSuffixes) {
      if (!ends_with(name, suf)) continue;
      std::string prefix = name.substr(0, name.size() - std::string(suf).size());
      if (store.find(prefix + ".weight")) out.insert(prefix);
      else orphans.push_back(fmt::format("tensor '{}' is a scale but '{}.weight' does not exist", name, prefix));
      break;
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> validate_checkpoint(const TensorStore& store, const LinearLoadOptions& opt) {
  std::vector<std::string> out;
  std::set<std::string> set = linear_prefixes(store, out);
  const std::vector<std::string> prefixes(set.begin(), set.end());
  // The scans read every scale byte (and FP8 weight byte) of the checkpoint:
  // spread the linears over threads, report in name order.
  std::vector<std::vector<std::string>> found(prefixes.size());
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t i = 0; i < int64_t(prefixes.size()); ++i)
    found[size_t(i)] = linear_problems(store, prefixes[size_t(i)], -1, -1, opt, true);
  for (const auto& f : found) out.insert(out.end(), f.begin(), f.end());
  return out;
}

bool glob_match(const std::string& pat, const std::string& s) {
  // Iterative matcher with backtracking to the last '*'.
  size_t p = 0, i = 0, star = std::string::npos, mark = 0;
  while (i < s.size()) {
    if (p < pat.size() && (pat[p] == '?' || pat[p] == s[i])) {
      ++p;
      ++i;
    } else if (p < pat.size() && pat[p] == '*') {
      star = p++;
      mark = i;
    } else if (star != std::string::npos) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pat.size() && pat[p] == '*') ++p;
  return p == pat.size();
}

std::vector<std::string> check_quant_config(const nlohmann::json& qcfg, const TensorStore& store) {
  std::vector<std::string> out;
  std::vector<std::string> dummy;
  std::set<std::string> prefixes = linear_prefixes(store, dummy);

  // What the config declares: NVFP4 for all linears, for routed experts only, or none.
  enum class Nv { NONE, ALL, MOE } nv = Nv::NONE;
  bool fp8 = false;
  std::vector<std::string> ignore;
  if (!qcfg.is_null()) {
    if (!qcfg.is_object()) return {"config.json: quantization_config is not an object"};
    std::string method = qcfg.value("quant_method", "");
    std::string algo = qcfg.value("quant_algo", "");
    std::string moe_algo = qcfg.value("moe_quant_algo", "");
    if (method == "modelopt") {
      // Modules a ModelOpt export keeps in DeepSeek's FP8 blocks carry the release fields.
      fp8 = qcfg.contains("weight_block_size");
      if (algo == "NVFP4") nv = Nv::ALL;
      else if (algo == "MIXED_PRECISION" && moe_algo == "NVFP4") nv = Nv::MOE, fp8 = true;
      else out.push_back(fmt::format("config.json: quantization_config quant_method 'modelopt' with quant_algo '{}' is not supported (NVFP4 or MIXED_PRECISION with moe_quant_algo NVFP4)", algo));
    } else if (method == "fp8") {
      fp8 = true;
      if (algo == "MIXED_PRECISION") {
        if (moe_algo == "NVFP4") nv = Nv::MOE;
        else out.push_back(fmt::format("config.json: quantization_config quant_algo MIXED_PRECISION with moe_quant_algo '{}' is not supported (NVFP4)", moe_algo));
      } else if (algo == "NVFP4") {
        nv = Nv::ALL;
      } else if (!algo.empty()) {
        out.push_back(fmt::format("config.json: quantization_config quant_algo '{}' is not supported", algo));
      }
    } else {
      out.push_back(fmt::format("config.json: quantization_config quant_method '{}' is not supported (modelopt or fp8)", method));
    }
    if (qcfg.contains("weight_block_size") && qcfg["weight_block_size"] != nlohmann::json::array({128, 128}))
      out.push_back(fmt::format("config.json: quantization_config weight_block_size {} is not supported (only [128, 128])", qcfg["weight_block_size"].dump()));
    if (nv != Nv::NONE && qcfg.contains("group_size") && qcfg["group_size"] != 16)
      out.push_back(fmt::format("config.json: quantization_config group_size {} is not supported for NVFP4 (16)", qcfg["group_size"].dump()));
    for (const char* key : {"ignore", "exclude_modules"}) {
      if (!qcfg.contains(key)) continue;
      if (!qcfg[key].is_array()) {
        out.push_back(fmt::format("config.json: quantization_config {} is not a list", key));
        continue;
      }
      for (const auto& g : qcfg[key])
        if (g.is_string()) ignore.push_back(g.get<std::string>());
        else out.push_back(fmt::format("config.json: quantization_config {} holds a non-string entry {}", key, g.dump()));
    }
  }

  auto ignored = [&](const std::string& prefix) {
    std::string bare = prefix.rfind("model.", 0) == 0 ? prefix.substr(6) : prefix;
    for (const std::string& g : ignore)
      if (glob_match(g, prefix) || glob_match(g, bare)) return true;
    return false;
  };
  // One line per kind of mismatch (count + first tensor), so a config that is
  // wrong for every expert does not print a million lines.
  struct Tally {
    int64_t n = 0;
    std::string first;
  };
  std::map<std::string, Tally> bad;
  auto note = [&](const std::string& what, const std::string& prefix) {
    Tally& t = bad[what];
    if (t.n++ == 0) t.first = prefix;
  };
  for (const std::string& prefix : prefixes) {
    std::optional<WeightFormat> f = stored_linear_format(store, prefix);
    if (!f) continue;  // structural problem: validate_checkpoint reports it
    ExpertName e;
    bool expert = parse_expert_name(prefix, &e);
    bool want_nv = !ignored(prefix) && (nv == Nv::ALL || (nv == Nv::MOE && expert));
    if (*f == WeightFormat::NVFP4 && !want_nv)
      note(nv == Nv::NONE ? "is NVFP4 but quantization_config declares no NVFP4"
                          : "is NVFP4 but quantization_config excludes it (ignore/exclude_modules or not a routed expert)",
           prefix);
    if (want_nv && (*f == WeightFormat::FP8_BLOCK || *f == WeightFormat::MXFP4))
      note(fmt::format("is {} but quantization_config declares it NVFP4", weight_format_name(*f)), prefix);
    if (*f == WeightFormat::FP8_BLOCK && !fp8 && !want_nv)
      note("is FP8-block but quantization_config declares no FP8", prefix);
    if (qcfg.is_null() && *f == WeightFormat::MXFP4) note("is MXFP4 but config.json has no quantization_config", prefix);
  }
  for (const auto& [what, t] : bad)
    out.push_back(t.n == 1 ? fmt::format("linear '{}' {}", t.first, what)
                           : fmt::format("linear '{}' and {} more {}", t.first, t.n - 1, what));
  return out;
}

}  // namespace cm
