// Structured output for one request (see structured.h).
#include "serve/structured.h"

#include <fmt/format.h>

#include <set>

#include "chat/dsv4.h"
#include "common/error.h"
#include "runtime/grammar_gate.h"
#include "tokenizer/tokenizer.h"

namespace cm::serve {

using Json = nlohmann::ordered_json;

namespace {

Json const_string(const std::string& v) { return {{"type", "const_string"}, {"value", v}}; }

// The value of one DSML parameter. DeepSeek-V4 writes strings as they are (string="true") and
// every other value as JSON (string="false"); a raw string may not hold '<' (it would end the
// value early for the parser, which stops at the first "</｜DSML｜parameter").
std::pair<bool, Json> parameter_value(const Json& schema) {
  const bool is_string = schema.is_object() && schema.value("type", Json()) == "string" && !schema.contains("format");
  if (!is_string) {
    Json js = schema.is_object() || schema.is_boolean() ? schema : Json::object();
    return {false, {{"type", "json_schema"}, {"json_schema", js}, {"max_whitespace_cnt", 1}}};
  }
  if (schema.contains("enum") && schema["enum"].is_array()) {
    Json alts = Json::array();
    for (const Json& e : schema["enum"])
      if (e.is_string()) alts.push_back(const_string(e.get<std::string>()));
    if (!alts.empty()) return {true, {{"type", "or"}, {"elements", alts}}};
  }
  if (schema.contains("const") && schema["const"].is_string()) return {true, const_string(schema["const"].get<std::string>())};
  std::string pattern = "[^<\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f]";
  const int64_t lo = schema.contains("minLength") && schema["minLength"].is_number_unsigned() ? schema["minLength"].get<int64_t>() : 0;
  if (schema.contains("maxLength") && schema["maxLength"].is_number_unsigned())
    pattern += fmt::format("{{{},{}}}", lo, schema["maxLength"].get<int64_t>());
  else
    pattern += fmt::format("{{{},}}", lo);
  return {true, {{"type", "regex"}, {"pattern", pattern}}};
}

// The parameter lines of one call: the schema's properties in their order, required ones always,
// others optional. (XGrammar's own "deepseek_xml" style lets whitespace in between, which
// DeepSeek-V4's parser refuses.) Properties beyond those listed are not generated.
Json parameter_lines(const Json& params) {
  const std::string d(chat::kDsml);
  Json lines = Json::array();
  if (!params.is_object() || !params.contains("properties") || !params["properties"].is_object()) return lines;
  std::set<std::string> required;
  if (params.contains("required") && params["required"].is_array())
    for (const Json& r : params["required"])
      if (r.is_string()) required.insert(r.get<std::string>());
  for (const auto& [name, schema] : params["properties"].items()) {
    auto [is_string, value] = parameter_value(schema);
    Json line = {{"type", "sequence"},
                 {"elements", Json::array({const_string(fmt::format("<{}parameter name=\"{}\" string=\"{}\">", d, name,
                                                                    is_string ? "true" : "false")),
                                           value, const_string(fmt::format("</{}parameter>\n", d))})}};
    lines.push_back(required.count(name) ? line : Json{{"type", "optional"}, {"content", line}});
  }
  return lines;
}

}  // namespace

std::string tool_call_structural_tag(const Json& tools, const std::string& name) {
  // The text chat::parse_completion reads (and the encoder renders): "\n\n<｜DSML｜tool_calls>\n",
  // per call '<｜DSML｜invoke name="N">\n' + parameter lines + "</｜DSML｜invoke>\n", then
  // "</｜DSML｜tool_calls>" and EOS (XGrammar's deepseek_v4 builtin has the same frame).
  const std::string d(chat::kDsml);
  Json tags = Json::array();
  for (const Json& t : tools) {
    const Json& f = t["function"];
    const std::string n = f["name"].get<std::string>();
    if (!name.empty() && n != name) continue;
    Json elements = Json::array({const_string(fmt::format("<{}invoke name=\"{}\">\n", d, n))});
    for (Json& line : parameter_lines(f.contains("parameters") ? f["parameters"] : Json())) elements.push_back(std::move(line));
    elements.push_back(const_string(fmt::format("</{}invoke>\n", d)));
    tags.push_back({{"type", "sequence"}, {"elements", elements}});
  }
  CM_CHECK(!tags.empty(), "tools: no tool named '{}'", name);
  // One call of the named tool, or one or more calls of any listed tool.
  Json calls = name.empty() ? Json{{"type", "plus"}, {"content", tags.size() == 1 ? tags[0] : Json{{"type", "or"}, {"elements", tags}}}}
                            : tags[0];
  Json seq = {{"type", "sequence"},
              {"elements", Json::array({Json{{"type", "const_string"}, {"value", fmt::format("\n\n<{}tool_calls>\n", d)}},
                                        calls,
                                        Json{{"type", "const_string"}, {"value", fmt::format("</{}tool_calls>", d)}}})}};
  return Json{{"type", "structural_tag"}, {"format", seq}}.dump();
}

ConstraintResult request_constraint(const ApiRequest& r, const std::shared_ptr<GrammarCompiler>& gc,
                                    const Tokenizer& tok) {
  ConstraintResult out;
  const bool tool = r.endpoint == Endpoint::Chat && (r.tool_choice == "required" || r.tool_choice == "function");
  if (!r.format && !tool) return out;
  GrammarSpec spec;
  std::string param;
  try {
    if (tool) {
      param = "tools";
      spec.kind = GrammarKind::StructuralTag;
      spec.source = "tools";
      spec.text = tool_call_structural_tag(r.tools, r.tool_choice == "function" ? r.tool_name : "");
    } else {
      spec = *r.format;
      param = spec.source.substr(0, spec.source.find('.'));
    }
    if (!gc) {
      out.error = ApiError{400, "invalid_request_error", "this server runs without structured output", param};
      return out;
    }
    auto g = std::make_shared<runtime::JobGrammar>();
    g->compiler = gc;
    g->grammar = gc->compile(spec);
    if (r.endpoint == Endpoint::Chat && r.mode == chat::Mode::Thinking) {
      // Reasoning stays free; the structured part starts after </think>, one special token in
      // DeepSeek-V4's vocabulary.
      std::vector<int32_t> ids = tok.encode(std::string(chat::kThinkEnd));
      CM_CHECK(ids.size() == 1, "{}: structured output in thinking mode needs {} to be one token", param,
               chat::kThinkEnd);
      g->after_token = ids[0];
    }
    out.constraint = std::move(g);
  } catch (const std::exception& e) {
    out.error = ApiError{400, "invalid_request_error", e.what(), param};
  }
  return out;
}

}  // namespace cm::serve
