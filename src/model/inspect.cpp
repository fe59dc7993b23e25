// Checkpoint inspection; see inspect.h.
#include "model/inspect.h"

#include <fmt/format.h>

#include <map>
#include <regex>
#include <set>

#include "common/error.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"
#include "quant/validate.h"

namespace cm {

namespace {

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Sidecar tensors that belong to the linear `<module>.weight`.
const char* const kSidecars[] = {".weight_scale_inv", ".weight_scale_2", ".weight_scale", ".input_scale", ".scale"};

nlohmann::json rope_json(const RopeConfig& r) {
  nlohmann::json j = {{"theta", r.theta}, {"yarn", r.yarn}};
  if (r.yarn)
    j.update({{"factor", r.factor}, {"original_max_position", r.original_max_position}, {"beta_fast", r.beta_fast},
              {"beta_slow", r.beta_slow}});
  return j;
}

nlohmann::json config_json(const Config& c) {
  nlohmann::json layers = nlohmann::json::array();
  int64_t hash = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    bool h = c.moe_kinds[size_t(l)] == MoeKind::HASH;
    hash += h;
    layers.push_back({{"layer", l}, {"attn", attn_kind_name(c.attn_kinds[size_t(l)])}, {"ratio", c.ratio(l)},
                      {"moe", h ? "hash" : "score"}});
  }
  return {{"spelling", c.spelling}, {"hidden_size", c.hidden_size}, {"num_layers", c.num_layers},
          {"num_heads", c.num_heads}, {"head_dim", c.head_dim}, {"vocab_size", c.vocab_size},
          {"n_routed_experts", c.n_routed_experts}, {"n_experts_per_tok", c.n_experts_per_tok},
          {"n_shared_experts", c.n_shared_experts}, {"moe_intermediate_size", c.moe_inter},
          {"hash_layers", hash}, {"layers", layers}, {"rope_main", rope_json(c.rope_main)},
          {"rope_compress", rope_json(c.rope_compress)}, {"mtp_layers", c.num_nextn_predict_layers},
          {"quantization_config", c.quantization}};
}

}  // namespace

std::string module_group(const std::string& name) {
  static const std::regex num(R"((^|\.)\d+(?=\.|$))");
  std::string b = name.rfind("model.", 0) == 0 ? name.substr(6) : name;
  return std::regex_replace(b, num, "$1*");
}

nlohmann::json inspect_checkpoint(const std::string& dir, const LinearLoadOptions& opt) {
  nlohmann::json r;
  std::vector<std::string> problems;
  nlohmann::json qcfg;
  try {
    Config c = config_load(dir);
    r["config"] = config_json(c);
    qcfg = c.quantization;
  } catch (const Error& e) {
    r["config_error"] = e.what();
    problems.push_back(e.what());
  }
  TensorStore store = TensorStore::open_dir(dir);

  // Group modules: a linear (`X.weight` + its sidecars) counts once, with its
  // logical [N, K] parameters and the bytes of all its tensors.
  struct Acc {
    int64_t modules = 0, params = 0;
    size_t bytes = 0;
  };
  std::map<std::pair<std::string, std::string>, Acc> groups;
  std::set<std::string> claimed;
  int64_t linear_params = 0, nvfp4_params = 0;
  for (const auto& [name, t] : store.all()) {
    if (!ends_with(name, ".weight")) continue;
    const std::string m = name.substr(0, name.size() - 7);
    std::optional<WeightFormat> f = stored_linear_format(store, m);
    std::string fmt_name = f ? weight_format_name(*f) : std::string(dtype_name(t->dtype));
    bool packed = t->dtype == DType::U8 || t->dtype == DType::I8;
    int64_t params = t->shape.size() == 2 ? t->shape[0] * t->shape[1] * (packed ? 2 : 1) : t->numel();
    size_t bytes = t->nbytes;
    claimed.insert(name);
    for (const char* s : kSidecars)
      if (const TensorView* sv = store.find(m + s)) bytes += sv->nbytes, claimed.insert(sv->name);
    Acc& a = groups[{module_group(m), t->shape.size() == 2 ? fmt_name : std::string(dtype_name(t->dtype))}];
    a.modules += 1;
    a.params += params;
    a.bytes += bytes;
    const std::string g = module_group(m);
    if (t->shape.size() == 2 && g != "embed" && g != "embed_tokens") {
      linear_params += params;
      if (f && *f == WeightFormat::NVFP4) nvfp4_params += params;
    }
  }
  for (const auto& [name, t] : store.all()) {
    if (claimed.count(name)) continue;
    Acc& a = groups[{module_group(name), std::string(dtype_name(t->dtype))}];
    a.modules += 1;
    a.params += t->numel();
    a.bytes += t->nbytes;
  }
  nlohmann::json garr = nlohmann::json::array();
  for (const auto& [key, a] : groups)
    garr.push_back({{"group", key.first}, {"format", key.second}, {"modules", a.modules}, {"params", a.params},
                    {"bytes", a.bytes}});
  r["groups"] = garr;
  r["linear_params"] = linear_params;
  r["nvfp4_params"] = nvfp4_params;
  r["nvfp4_coverage"] = linear_params ? double(nvfp4_params) / double(linear_params) : 0.0;
  r["total_bytes"] = store.total_bytes();
  r["mtp_blocks"] = checkpoint_mtp_blocks(store);
  std::vector<std::string> v = validate_checkpoint(store, opt);
  problems.insert(problems.end(), v.begin(), v.end());
  if (r.contains("config")) {
    std::vector<std::string> q = check_quant_config(qcfg, store);
    problems.insert(problems.end(), q.begin(), q.end());
  }
  r["problems"] = problems;
  return r;
}

std::string inspect_text(const nlohmann::json& r) {
  std::string o;
  if (r.contains("config")) {
    const auto& c = r["config"];
    o += fmt::format("config ({} spelling): hidden {}, {} layers, {} heads x {}, vocab {}, MTP layers {}\n",
                     c["spelling"].get<std::string>(), c["hidden_size"].get<int64_t>(), c["num_layers"].get<int64_t>(),
                     c["num_heads"].get<int64_t>(), c["head_dim"].get<int64_t>(), c["vocab_size"].get<int64_t>(),
                     c["mtp_layers"].get<int64_t>());
    o += fmt::format("experts: {} routed ({} per token), {} shared, intermediate {}; {} hash-routed layer(s)\n",
                     c["n_routed_experts"].get<int64_t>(), c["n_experts_per_tok"].get<int64_t>(),
                     c["n_shared_experts"].get<int64_t>(), c["moe_intermediate_size"].get<int64_t>(),
                     c["hash_layers"].get<int64_t>());
    auto rope = [](const nlohmann::json& j) {
      std::string s = fmt::format("theta {}", j["theta"].get<double>());
      if (j["yarn"].get<bool>())
        s += fmt::format(", YaRN factor {} original {} beta {}/{}", j["factor"].get<double>(),
                         j["original_max_position"].get<double>(), j["beta_fast"].get<double>(),
                         j["beta_slow"].get<double>());
      return s;
    };
    o += "rope: window layers " + rope(c["rope_main"]) + "; compressed layers " + rope(c["rope_compress"]) + "\n";
    o += "layers:";
    for (const auto& l : c["layers"])
      o += fmt::format(" {}:{}", l["layer"].get<int64_t>(), l["attn"].get<std::string>()) +
           (l["ratio"].get<int64_t>() ? fmt::format("/{}", l["ratio"].get<int64_t>()) : std::string()) +
           (l["moe"] == "hash" ? "+hash" : "");
    o += "\n";
    if (!c["quantization_config"].is_null()) o += "quantization_config: " + c["quantization_config"].dump() + "\n";
  }
  o += fmt::format("\n{:<48} {:<10} {:>8} {:>16} {:>14}\n", "module group", "format", "modules", "params", "bytes");
  for (const auto& g : r["groups"])
    o += fmt::format("{:<48} {:<10} {:>8} {:>16} {:>14}\n", g["group"].get<std::string>(), g["format"].get<std::string>(),
                     g["modules"].get<int64_t>(), g["params"].get<int64_t>(), g["bytes"].get<size_t>());
  o += fmt::format("\nNVFP4 coverage: {:.2f}% of {} linear parameters ({} NVFP4)\n",
                   100.0 * r["nvfp4_coverage"].get<double>(), r["linear_params"].get<int64_t>(),
                   r["nvfp4_params"].get<int64_t>());
  if (r.contains("mtp_blocks"))
    o += fmt::format("MTP blocks stored: {}{}\n", r["mtp_blocks"].get<int64_t>(),
                     r.contains("config") ? fmt::format(" (the config names {})", r["config"]["mtp_layers"].get<int64_t>())
                                          : std::string());
  o += fmt::format("total size: {} bytes ({:.3f} GiB)\n", r["total_bytes"].get<size_t>(),
                   double(r["total_bytes"].get<size_t>()) / double(1ull << 30));
  const auto& p = r["problems"];
  if (p.empty()) o += "validation: OK\n";
  else {
    o += fmt::format("validation: {} problem(s)\n", p.size());
    for (const auto& l : p) o += "  " + l.get<std::string>() + "\n";
  }
  return o;
}

}  // namespace cm
