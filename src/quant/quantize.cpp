// NVFP4 checkpoint writer; see quantize.h.
#include "quant/quantize.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "common/error.h"
#include "io/input_file.h"
#include "io/output_file.h"
#include "io/safetensors.h"
#include "quant/codec.h"
#include "quant/load_linear.h"
#include "quant/validate.h"

namespace fs = std::filesystem;

namespace cm {

bool store_is_nvfp4(const TensorStore& store, const std::string& module);

namespace {

constexpr float kE2M1xE4M3 = 6.0f * 448.0f;

std::string bare(const std::string& m) { return m.rfind("model.", 0) == 0 ? m.substr(6) : m; }

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

bool any_glob(const std::vector<std::string>& globs, const std::string& module) {
  for (const std::string& g : globs)
    if (glob_match(g, module) || glob_match(g, bare(module))) return true;
  return false;
}

// One output unit: a source tensor copied as is, or a linear quantized to NVFP4.
struct Item {
  std::string name;  // tensor name (copy) or module name (NVFP4)
  bool nvfp4 = false;
  int64_t n = 0, k = 0;
  float input_scale = 0;
  size_t out_bytes = 0;
};

// Quantizes the linear `module` of the source store into its four tensors.
std::vector<TensorData> quantize_linear(const TensorStore& store, const Item& it) {
  LinearLoadOptions lo;
  lo.allow_missing_input_scale = true;
  LinearWeight w = load_linear(store, it.name, it.n, it.k, lo);
  const int64_t N = it.n, K = it.k;
  float amax = 0.0f;
  int64_t bad_row = -1;
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(K));
    float local = 0.0f;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      linear_expand_row(w, n, row.data());
      for (float v : row) {
        if (!std::isfinite(v)) {
#pragma omp critical
          bad_row = n;
        }
        local = std::max(local, std::fabs(v));
      }
    }
#pragma omp critical
    amax = std::max(amax, local);
  }
  if (bad_row >= 0) fail("cannot quantize '{}.weight': row {} holds a non-finite value", it.name, bad_row);
  const float s2 = nvfp4_global_scale(amax);
  TensorData q{it.name + ".weight", DType::U8, {N, K / 2}, std::vector<uint8_t>(size_t(N * K / 2))};
  TensorData s{it.name + ".weight_scale", DType::F8_E4M3, {N, K / 16}, std::vector<uint8_t>(size_t(N * K / 16))};
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      linear_expand_row(w, n, row.data());
      nvfp4_quantize_row(row.data(), K, s2, &q.bytes[size_t(n * K / 2)], &s.bytes[size_t(n * K / 16)]);
    }
  }
  auto scalar = [](const std::string& name, float v) {
    TensorData t{name, DType::F32, {}, std::vector<uint8_t>(4)};
    std::memcpy(t.bytes.data(), &v, 4);
    return t;
  };
  std::vector<TensorData> out;
  out.push_back(std::move(q));
  out.push_back(std::move(s));
  out.push_back(scalar(it.name + ".weight_scale_2", s2));
  out.push_back(scalar(it.name + ".input_scale", it.input_scale));
  return out;
}

// input_scale of every NVFP4 item: calibrated amax where observed; routed
// experts take the max over their layer's experts of the same projection
// kind; everything else the default.
void assign_input_scales(std::vector<Item>& items, const std::map<std::string, float>& amax, float default_amax,
                         QuantizeSummary& sum) {
  auto kind_key = [](const ExpertName& e) {
    bool down = e.proj == "w2" || e.proj == "down_proj";
    return e.base + (down ? "|down" : "|in");
  };
  std::map<std::string, float> group;
  for (const auto& [module, a] : amax) {
    ExpertName e;
    if (a > 0 && std::isfinite(a) && parse_expert_name(module, &e)) group[kind_key(e)] = std::max(group[kind_key(e)], a);
  }
  for (Item& it : items) {
    if (!it.nvfp4) continue;
    float a = 0;
    ExpertName e;
    if (parse_expert_name(it.name, &e)) {
      auto g = group.find(kind_key(e));
      if (g != group.end()) a = g->second;
    } else if (auto f = amax.find(it.name); f != amax.end() && std::isfinite(f->second)) {
      a = f->second;
    }
    if (a > 0) ++sum.calibrated;
    else ++sum.defaulted, a = default_amax;
    it.input_scale = a / kE2M1xE4M3;
  }
}

// ignore list: every 2-D weight module that is not NVFP4 in the output, with
// layer/expert numbers folded into '*' where the glob matches no NVFP4 module.
std::vector<std::string> ignore_list(const TensorStore& out_store) {
  std::set<std::string> nv, other;
  for (const auto& [name, t] : out_store.all()) {
    if (!ends_with(name, ".weight") || t->shape.size() != 2) continue;
    std::string m = name.substr(0, name.size() - 7);
    (store_is_nvfp4(out_store, m) ? nv : other).insert(bare(m));
  }
  static const std::regex num(R"((^|\.)\d+(\.|$))");
  std::set<std::string> globs;
  for (const std::string& m : other) {
    std::string g = std::regex_replace(std::regex_replace(m, num, "$1*$2"), num, "$1*$2");
    bool clash = false;
    for (const std::string& v : nv) clash = clash || glob_match(g, v);
    globs.insert(clash ? m : g);
  }
  return {globs.begin(), globs.end()};
}

}  // namespace

bool quantize_default_target(const std::string& module) {
  // Release / transformers-saved spelling, then the HF-MAP spelling (spec §10).
  static const std::regex release(
      R"(^layers\.\d+\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|ffn\.shared_experts\.(w1|w2|w3)|ffn\.experts\.\d+\.(w1|w2|w3))$)");
  static const std::regex hf(
      R"(^layers\.\d+\.(self_attn\.(q_a_proj|q_b_proj|kv_proj|o_a_proj|o_b_proj)|mlp\.shared_experts\.(gate_proj|up_proj|down_proj)|mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj))$)");
  const std::string b = bare(module);
  return std::regex_match(b, release) || std::regex_match(b, hf);
}

bool quantize_selected(const std::string& module, const std::vector<std::string>& include,
                       const std::vector<std::string>& exclude) {
  if (any_glob(exclude, module)) return false;
  return quantize_default_target(module) || any_glob(include, module);
}

bool store_is_nvfp4(const TensorStore& store, const std::string& module) {
  auto f = stored_linear_format(store, module);
  return f && *f == WeightFormat::NVFP4;
}

QuantizeSummary quantize_checkpoint(const QuantizeOptions& opt, const std::map<std::string, float>& input_amax,
                                    std::FILE* log) {
  QuantizeSummary sum;
  CM_CHECK(opt.shard_bytes > 0, "--shard-size must be > 0");
  CM_CHECK(std::isfinite(opt.default_input_amax) && opt.default_input_amax > 0,
           "--default-input-amax must be finite and > 0 (got {})", opt.default_input_amax);
  std::error_code ec;
  if (fs::exists(opt.out_dir) && fs::equivalent(opt.in_dir, opt.out_dir, ec))
    fail("--out '{}' is the input directory", opt.out_dir);
  if (fs::exists(opt.out_dir) && !fs::is_directory(opt.out_dir))
    fail("--out '{}' exists and is not a directory", opt.out_dir);
  if (fs::exists(opt.out_dir) && !fs::is_empty(opt.out_dir))
    fail("--out '{}' exists and is not empty; refusing to overwrite", opt.out_dir);
  // Everything is written into a staging directory next to --out and renamed
  // to --out only when complete and validated; a failure removes it.
  fs::path out = fs::absolute(opt.out_dir).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  if (!fs::is_directory(out.parent_path()))
    fail("--out '{}': directory '{}' does not exist", opt.out_dir, out.parent_path().string());
  const fs::path stage = out.parent_path() / ("." + out.filename().string() + ".tmp-" + std::to_string(::getpid()));
  struct Cleanup {
    fs::path p;
    bool keep = false;
    ~Cleanup() {
      std::error_code e;
      if (!keep) fs::remove_all(p, e);
    }
  } cleanup{stage};
  fs::remove_all(stage, ec);
  if (!fs::create_directory(stage, ec) || ec)
    fail("--out '{}': cannot create the staging directory '{}': {}", opt.out_dir, stage.string(), ec.message());
  TensorStore store = TensorStore::open_dir(opt.in_dir);
  {
    LinearLoadOptions lo;
    lo.allow_missing_input_scale = true;
    std::vector<std::string> p = validate_checkpoint(store, lo);
    if (!p.empty()) {
      std::string msg = fmt::format("source checkpoint '{}' is invalid ({} problem(s)):", opt.in_dir, p.size());
      for (const std::string& l : p) msg += "\n  " + l;
      throw Error(msg);
    }
  }
  nlohmann::json cfg = read_json_file((fs::path(opt.in_dir) / "config.json").string());
  if (!cfg.is_object()) fail("{}/config.json: not a JSON object", opt.in_dir);

  // Plan: what each source tensor becomes.
  std::vector<Item> items;
  std::set<std::string> dropped;  // source scales of quantized linears
  for (const auto& [name, t] : store.all()) {
    sum.bytes_in += t->nbytes;
    if (!ends_with(name, ".weight")) continue;
    const std::string m = name.substr(0, name.size() - 7);
    if (!quantize_selected(m, opt.include, opt.exclude) || store_is_nvfp4(store, m)) continue;
    if (t->shape.size() != 2 || !stored_linear_format(store, m)) {
      std::fprintf(log, "quantize: '%s' is not a 2-D linear weight; kept as stored\n", name.c_str());
      continue;
    }
    const bool packed = t->dtype == DType::U8 || t->dtype == DType::I8;
    Item it;
    it.name = m;
    it.nvfp4 = true;
    it.n = t->shape[0];
    it.k = packed ? t->shape[1] * 2 : t->shape[1];
    if (it.k % 16) fail("cannot quantize '{}': in_features {} is not a multiple of 16 (exclude it)", name, it.k);
    it.out_bytes = size_t(it.n * it.k / 2 + it.n * it.k / 16 + 8);
    items.push_back(it);
    for (const char* s : {".scale", ".weight_scale_inv", ".weight", ".input_scale"}) dropped.insert(m + s);
  }
  for (const auto& [name, t] : store.all())
    if (!dropped.count(name)) items.push_back(Item{name, false, 0, 0, 0, t->nbytes});
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.name < b.name; });
  assign_input_scales(items, input_amax, opt.default_input_amax, sum);
  if (sum.defaulted)
    std::fprintf(log, "quantize: %lld input_scale(s) without calibration use the default activation amax %g "
                      "(input_scale %g)\n", (long long)sum.defaulted, double(opt.default_input_amax),
                 double(opt.default_input_amax / kE2M1xE4M3));

  // Shards: consecutive items up to shard_bytes each.
  std::vector<std::vector<const Item*>> shards(1);
  size_t cur = 0;
  for (const Item& it : items) {
    if (cur > 0 && cur + it.out_bytes > size_t(opt.shard_bytes)) shards.emplace_back(), cur = 0;
    shards.back().push_back(&it);
    cur += it.out_bytes;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  const size_t S = shards.size();
  int64_t done = 0, total_q = 0;
  for (const Item& it : items) total_q += it.nvfp4;
  for (size_t si = 0; si < S; ++si) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", si + 1, S);
    std::vector<TensorData> ts;
    for (const Item* it : shards[si]) {
      if (it->nvfp4) {
        for (TensorData& t : quantize_linear(store, *it)) ts.push_back(std::move(t));
        ++sum.quantized;
        sum.nvfp4_params += it->n * it->k;
        if (++done % 64 == 0 || done == total_q)
          std::fprintf(log, "quantize: %lld/%lld linears (%s)\n", (long long)done, (long long)total_q, it->name.c_str());
      } else {
        const TensorView& v = store.get(it->name);
        ts.push_back(TensorData{v.name, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes)});
        ++sum.kept;
      }
    }
    for (const TensorData& t : ts) {
      weight_map[t.name] = file;
      sum.bytes_out += t.bytes.size();
    }
    write_safetensors((stage / file).string(), ts, {{"format", "pt"}});
    std::fprintf(log, "quantize: wrote %s (%zu tensors)\n", file.c_str(), ts.size());
  }
  sum.shards = int64_t(S);
  {
    nlohmann::json idx = {{"metadata", {{"total_size", sum.bytes_out}}}, {"weight_map", weight_map}};
    write_output_file((stage / "model.safetensors.index.json").string(), idx.dump(1) + "\n");
  }

  // config.json with the ModelOpt quantization_config; tokenizer and other files copied.
  TensorStore out_store = TensorStore::open_dir(stage.string());
  sum.ignore = ignore_list(out_store);
  nlohmann::json q = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16},
                      {"ignore", sum.ignore}, {"producer", {{"name", "clawmine"}}}};
  bool fp8_left = false;
  for (const auto& [name, t] : out_store.all())
    if (ends_with(name, ".weight")) {
      auto f = stored_linear_format(out_store, name.substr(0, name.size() - 7));
      fp8_left = fp8_left || (f && *f == WeightFormat::FP8_BLOCK);
    }
  if (fp8_left) {  // modules kept in the release FP8 format
    nlohmann::json old = cfg.value("quantization_config", nlohmann::json::object());
    q["weight_block_size"] = {128, 128};
    q["fmt"] = "e4m3";
    q["scale_fmt"] = old.value("scale_fmt", "ue8m0");
    q["activation_scheme"] = "dynamic";
  }
  cfg["quantization_config"] = q;
  write_output_file((stage / "config.json").string(), cfg.dump(2) + "\n");
  for (const auto& e : fs::directory_iterator(opt.in_dir)) {
    const std::string fn = e.path().filename().string();
    if (!e.is_regular_file() || ends_with(fn, ".safetensors") || fn == "model.safetensors.index.json" ||
        fn == "config.json" || fn == "hf_quant_config.json")
      continue;
    // The staging directory is new and private: a plain checked copy is safe here.
    fs::copy_file(e.path(), stage / fn, ec);
    if (ec) fail("quantize: cannot copy '{}' into the output: {}", e.path().string(), ec.message());
  }

  // Self-check: the result must pass the same validation as loading.
  std::vector<std::string> p = validate_checkpoint(out_store, {});
  std::vector<std::string> pc = check_quant_config(q, out_store);
  p.insert(p.end(), pc.begin(), pc.end());
  if (!p.empty()) {
    std::string msg = "quantized checkpoint failed validation:";
    for (const std::string& l : p) msg += "\n  " + l;
    throw Error(msg);
  }
  fs::rename(stage, out, ec);  // replaces an empty --out directory
  if (ec) fail("--out '{}': cannot move the finished checkpoint into place: {}", opt.out_dir, ec.message());
  cleanup.keep = true;
  return sum;
}

}  // namespace cm
