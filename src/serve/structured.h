// Structured output for one request, compiled on the HTTP thread (so a schema XGrammar cannot
// compile is a 400 before any generation): the request's format (response_format, vLLM's
// structured_outputs / guided_*, llama.cpp's json_schema / grammar: ApiRequest::format) or a
// tool_choice that forces a tool call ("required", or the named function form). The result is
// the JobSpec's constraint (runtime/grammar_gate.h); the engine masks every other token.
//
// tool_choice: the answer must be one DeepSeek-V4 DSML tool-call block (chat/dsv4.h), holding one
// or more calls ("required") of listed tools, or exactly one call of the named tool; each call's
// parameters follow the tool's `parameters` JSON schema in DSML's parameter syntax (XGrammar's
// structural tag with its "deepseek_xml" style). The Responder turns the block into `tool_calls`
// with finish_reason "tool_calls".
// Thinking mode: reasoning comes first, free, and the constraint starts after the </think>
// token (end ids are banned until then, so the answer cannot end before its structured part).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "runtime/token_constraint.h"
#include "serve/request.h"

namespace cm {
class Tokenizer;
}

namespace cm::serve {

struct ConstraintResult {
  std::shared_ptr<const runtime::TokenConstraintFactory> constraint;  // null: none asked for
  std::optional<ApiError> error;
};

// gc: the server's compiler (null: structured output unavailable, a 400 when asked for).
// Never throws.
ConstraintResult request_constraint(const ApiRequest& r, const std::shared_ptr<GrammarCompiler>& gc,
                                    const Tokenizer& tok);

// XGrammar structural-tag JSON for a DSML tool-call block: one call of `name`, or ("" ) one or
// more calls of any tool in `tools` (the request's OpenAI tools array).
std::string tool_call_structural_tag(const nlohmann::ordered_json& tools, const std::string& name);

}  // namespace cm::serve
