// parse_request_format: the structured-output fields of OpenAI, vLLM and llama.cpp requests.
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "grammar/grammar.h"

namespace cm {
namespace {

using json = nlohmann::json;

// A schema given as an object (or boolean), or as a string holding one.
std::string schema_text(const json& v, const std::string& field) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    auto parsed = json::parse(v.get<std::string>(), nullptr, false);
    CM_CHECK(!parsed.is_discarded() && (parsed.is_object() || parsed.is_boolean()),
             "{}: the schema string is not a JSON object", field);
    return parsed.dump();
  }
  fail("{}: must be a JSON schema object (got {})", field, v.type_name());
}

std::string string_of(const json& v, const std::string& field) {
  CM_CHECK(v.is_string(), "{}: must be a string (got {})", field, v.type_name());
  return v.get<std::string>();
}

std::vector<std::string> choices_of(const json& v, const std::string& field) {
  CM_CHECK(v.is_array(), "{}: must be an array of strings (got {})", field, v.type_name());
  CM_CHECK(!v.empty(), "{}: must not be empty", field);
  std::vector<std::string> out;
  for (const auto& c : v) {
    CM_CHECK(c.is_string(), "{}: every choice must be a string (got {})", field, c.type_name());
    out.push_back(c.get<std::string>());
  }
  return out;
}

std::optional<GrammarSpec> from_response_format(const json& rf) {
  const std::string f = "response_format";
  CM_CHECK(rf.is_object(), "{}: must be an object (got {})", f, rf.type_name());
  CM_CHECK(rf.contains("type") && rf["type"].is_string(), "{}.type: must be a string", f);
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  GrammarSpec s;
  if (type == "json_object") {
    s.kind = GrammarKind::JsonObject;
    s.source = f;
    return s;
  }
  if (type == "json_schema") {
    CM_CHECK(rf.contains("json_schema") && rf["json_schema"].is_object(),
             "{}.json_schema: must be an object {{name, schema, strict}}", f);
    const json& js = rf["json_schema"];
    if (js.contains("name")) string_of(js["name"], f + ".json_schema.name");
    s.kind = GrammarKind::JsonSchema;
    s.source = f + ".json_schema.schema";
    // A json_schema without a schema allows any JSON object (as OpenAI does).
    s.text = js.contains("schema") && !js["schema"].is_null() ? schema_text(js["schema"], s.source)
                                                              : std::string(R"({"type":"object"})");
    if (js.contains("strict") && !js["strict"].is_null()) {
      CM_CHECK(js["strict"].is_boolean(), "{}.json_schema.strict: must be a boolean", f);
      s.strict = js["strict"].get<bool>();
    } else {
      s.strict = false;
    }
    return s;
  }
  fail("{}.type: unknown type \"{}\" (text, json_object or json_schema)", f, type);
}

// vLLM's {json, regex, choice, grammar, json_object} (structured_outputs) or the guided_* fields.
void add_vllm(const std::string& field, const std::string& kind, const json& v,
              std::vector<std::pair<std::string, std::optional<GrammarSpec>>>& found) {
  GrammarSpec s;
  s.source = field;
  if (kind == "json") {
    s.kind = GrammarKind::JsonSchema;
    s.text = schema_text(v, field);
  } else if (kind == "regex") {
    s.kind = GrammarKind::Regex;
    s.text = string_of(v, field);
  } else if (kind == "choice") {
    s.kind = GrammarKind::Choice;
    s.choices = choices_of(v, field);
  } else if (kind == "grammar") {
    s.kind = GrammarKind::Ebnf;
    s.text = string_of(v, field);
  } else if (kind == "json_object") {
    CM_CHECK(v.is_boolean(), "{}: must be a boolean", field);
    if (!v.get<bool>()) return;
    s.kind = GrammarKind::JsonObject;
  }
  found.emplace_back(field, s);
}

}  // namespace

std::optional<GrammarSpec> parse_request_format(const json& body) {
  if (!body.is_object()) return std::nullopt;
  std::vector<std::pair<std::string, std::optional<GrammarSpec>>> found;
  auto present = [&](const char* k) { return body.contains(k) && !body[k].is_null(); };

  if (present("response_format")) {
    auto s = from_response_format(body["response_format"]);
    if (s) found.emplace_back("response_format", s);
  }
  if (present("structured_outputs")) {
    const json& so = body["structured_outputs"];
    CM_CHECK(so.is_object(), "structured_outputs: must be an object (got {})", so.type_name());
    for (const char* k : {"json", "regex", "choice", "grammar", "json_object"}) {
      if (so.contains(k) && !so[k].is_null()) add_vllm(std::string("structured_outputs.") + k, k, so[k], found);
    }
  }
  for (const char* k : {"json", "regex", "choice", "grammar"}) {
    const std::string f = std::string("guided_") + k;
    if (present(f.c_str())) add_vllm(f, k, body[f], found);
  }
  if (present("json_schema")) add_vllm("json_schema", "json", body["json_schema"], found);
  if (present("grammar")) add_vllm("grammar", "grammar", body["grammar"], found);

  if (found.empty()) return std::nullopt;
  CM_CHECK(found.size() == 1, "{} and {} both ask for a structured output; give one", found[0].first,
           found[1].first);
  return found[0].second;
}

}  // namespace cm
