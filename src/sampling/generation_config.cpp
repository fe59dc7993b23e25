// generation_config.json reader; see generation_config.h.
#include "sampling/generation_config.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace cm {

GenerationDefaults parse_generation_config(const std::string& json_text) {
  GenerationDefaults g;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    fail("generation_config.json: invalid JSON: {}", e.what());
  }
  CM_CHECK(j.is_object(), "generation_config.json: top level must be an object");
  auto number = [&](const char* key) -> std::optional<double> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    CM_CHECK(j[key].is_number(), "generation_config.json: {} must be a number", key);
    return j[key].get<double>();
  };
  bool do_sample = j.contains("do_sample") && j["do_sample"].is_boolean() && j["do_sample"].get<bool>();
  if (auto t = number("temperature"); t && do_sample) g.sampling.temperature = static_cast<float>(*t);
  if (do_sample && !number("temperature")) g.sampling.temperature = 1.0f;  // HF default when sampling
  if (auto v = number("top_p")) g.sampling.top_p = static_cast<float>(*v);
  if (auto v = number("top_k")) g.sampling.top_k = static_cast<int>(*v);
  if (auto v = number("min_p")) g.sampling.min_p = static_cast<float>(*v);
  if (auto v = number("repetition_penalty")) g.sampling.repetition_penalty = static_cast<float>(*v);
  if (auto v = number("max_new_tokens")) g.max_new_tokens = static_cast<int>(*v);
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const auto& e = j["eos_token_id"];
    if (e.is_number_integer()) {
      g.eos_ids.push_back(e.get<int32_t>());
    } else {
      CM_CHECK(e.is_array(), "generation_config.json: eos_token_id must be an id or a list of ids");
      for (const auto& x : e) {
        CM_CHECK(x.is_number_integer(), "generation_config.json: eos_token_id entries must be integers");
        g.eos_ids.push_back(x.get<int32_t>());
      }
    }
  }
  try {
    validate_sampling_params(g.sampling);
  } catch (const Error& e) {
    fail("generation_config.json: {}", e.what());
  }
  return g;
}

GenerationDefaults load_generation_config(const std::string& dir) {
  std::filesystem::path p = std::filesystem::path(dir) / "generation_config.json";
  if (!std::filesystem::exists(p)) return {};
  std::ifstream f(p, std::ios::binary);
  CM_CHECK(f.good(), "cannot read {}", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_generation_config(ss.str());
}

}  // namespace cm
