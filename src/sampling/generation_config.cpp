// generation_config.json reader; see generation_config.h.
#include "sampling/generation_config.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <climits>
#include <cmath>

#include "common/error.h"
#include "io/input_file.h"

namespace cm {

GenerationDefaults parse_generation_config(const std::string& json_text) {
  GenerationDefaults g;
  nlohmann::json j = parse_json(json_text, "generation_config.json");
  CM_CHECK(j.is_object(), "generation_config.json: top level must be an object");
  auto number = [&](const char* key) -> std::optional<double> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    CM_CHECK(j[key].is_number(), "generation_config.json: key '{}': expected a number, got {}", key,
             json_type_name(j[key]));
    return j[key].get<double>();
  };
  if (j.contains("do_sample") && !j["do_sample"].is_null() && !j["do_sample"].is_boolean())
    fail("generation_config.json: key 'do_sample': expected a boolean, got {}", json_type_name(j["do_sample"]));
  bool do_sample = j.contains("do_sample") && j["do_sample"].is_boolean() && j["do_sample"].get<bool>();
  if (auto t = number("temperature"); t && do_sample) g.sampling.temperature = static_cast<float>(*t);
  if (do_sample && !number("temperature")) g.sampling.temperature = 1.0f;  // HF default when sampling
  if (auto v = number("top_p")) g.sampling.top_p = static_cast<float>(*v);
  auto integer = [&](const char* key) -> std::optional<int> {
    auto v = number(key);
    if (!v) return std::nullopt;
    CM_CHECK(*v >= double(INT_MIN) && *v <= double(INT_MAX) && *v == std::floor(*v),
             "generation_config.json: key '{}': {} is not an integer in range", key, *v);
    return static_cast<int>(*v);
  };
  if (auto v = integer("top_k")) g.sampling.top_k = *v;
  if (auto v = number("min_p")) g.sampling.min_p = static_cast<float>(*v);
  if (auto v = number("repetition_penalty")) g.sampling.repetition_penalty = static_cast<float>(*v);
  if (auto v = integer("max_new_tokens")) g.max_new_tokens = *v;
  auto token_id = [](const nlohmann::json& x) {
    CM_CHECK(x.is_number_integer(), "generation_config.json: key 'eos_token_id': expected an integer id, got {}",
             json_type_name(x));
    int64_t id = 0;
    CM_CHECK(json_int_in(x, 0, INT32_MAX, &id),
             "generation_config.json: key 'eos_token_id': {} is not a token id (0 to {})", x.dump(), INT32_MAX);
    return int32_t(id);
  };
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const auto& e = j["eos_token_id"];
    if (e.is_array()) {
      for (const auto& x : e) g.eos_ids.push_back(token_id(x));
    } else {
      g.eos_ids.push_back(token_id(e));
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
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(p, ec))) return {};
  try {
    return parse_generation_config(read_regular_file(p.string(), kMaxConfigBytes));
  } catch (const Error& e) {
    fail("{} (in {})", e.what(), dir);
  }
}

}  // namespace cm
