// Structured output for one request (see structured.h).
#include "serve/structured.h"

#include <fmt/format.h>

#include "chat/dsv4.h"
#include "common/error.h"
#include "runtime/grammar_gate.h"
#include "tokenizer/tokenizer.h"

namespace cm::serve {

using Json = nlohmann::ordered_json;

std::string tool_call_structural_tag(const Json& tools, const std::string& name) {
  // The text chat::parse_completion reads (and the encoder renders): "\n\n<｜DSML｜tool_calls>\n",
  // per call '<｜DSML｜invoke name="N">\n' + parameter lines + "</｜DSML｜invoke>\n", then
  // "</｜DSML｜tool_calls>" and EOS. The same shape as XGrammar's own deepseek_v4 builtin.
  const std::string d(chat::kDsml);
  Json tags = Json::array();
  for (const Json& t : tools) {
    const Json& f = t["function"];
    const std::string n = f["name"].get<std::string>();
    if (!name.empty() && n != name) continue;
    Json params = f.contains("parameters") && f["parameters"].is_object() ? f["parameters"]
                                                                            : Json{{"type", "object"}, {"properties", Json::object()}};
    tags.push_back({{"type", "tag"},
                    {"begin", fmt::format("<{}invoke name=\"{}\">\n", d, n)},
                    {"content", {{"type", "json_schema"}, {"json_schema", params}, {"style", "deepseek_xml"}}},
                    {"end", fmt::format("</{}invoke>\n", d)}});
  }
  CM_CHECK(!tags.empty(), "tools: no tool named '{}'", name);
  Json calls = name.empty() ? Json{{"type", "tags_with_separator"}, {"tags", tags}, {"separator", ""},
                                   {"at_least_one", true}, {"stop_after_first", false}}
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
