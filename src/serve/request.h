// OpenAI-style request parsing and validation for `clawmine serve`, as pure functions: a request
// body (bytes from the network) becomes a plain struct or an ApiError, never an exception and
// never a crash, whatever the bytes are. The HTTP layer calls these and nothing else touches the
// client's input, so a fuzzer can drive exactly what a client can (parse_request, then
// build_prompt with a tokenizer).
//
// Accepted fields (others are listed in ApiRequest::unknown_fields: the server names them in its
// log and goes on, as vLLM does, or refuses the request with --strict-requests):
//   both:  model, user (accepted, unused), max_tokens (chat also max_completion_tokens), temperature [0,2], top_p (0,1],
//          top_k (-1/0 = off), min_p [0,1], presence_penalty / frequency_penalty [-2,2],
//          repetition_penalty (0,∞), seed (choice i: serve/choices.h's choice_seed), stop (string or
//          array of up to 16 strings), stream,
//          stream_options.include_usage, n (1..16), best_of (n..16; not streamed when > n),
//          logit_bias ({"token id": bias in [-100, 100]}), ignore_eos, stop_token_ids, min_tokens
//          (vLLM extensions)
//   /v1/completions: prompt (string, [strings], [token ids] or [[token ids]]: each prompt its own
//          n choices, prompt-major), logprobs (int 0..20), echo
//   /v1/chat/completions: messages (DeepSeek-V4 chat encoding), tools, tool_choice
//          logprobs (bool), top_logprobs (0..20),
//          ("auto"|"none"|"required"|{"type": "function", "function": {"name"}}),
//          chat_template_kwargs {"thinking": bool}, reasoning_effort (low|medium|high|max; turns
//          thinking on unless chat_template_kwargs.thinking is false), response_format (also
//          rendered into the system message)
//   structured output (both; grammar/grammar.h parse_request_format): response_format,
//          structured_outputs, guided_json / guided_regex / guided_choice / guided_grammar,
//          json_schema, grammar -> ApiRequest::format (compiled later by serve/structured.h)
// Sampling fields that are absent take the model's generation_config.json values, then OpenAI's
// defaults (temperature 1).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/dsv4.h"
#include "grammar/grammar.h"
#include "sampling/sampler.h"

namespace cm {
class Tokenizer;
}

namespace cm::serve {

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the offending field ("" if none)
};

enum class Endpoint { Completions, Chat };

// Defaults a request falls back on (from the model's generation_config.json).
struct RequestDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  int64_t completions_max_tokens = 16;  // OpenAI's default for /v1/completions
};

// One prompt of a completions request: text, or token ids when `text` is empty.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> tokens;
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;  // "" when not given
  // /v1/completions: text or token ids.
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_tokens;
  std::vector<PromptInput> prompts;  // every prompt of a list (the first is also prompt_text/_tokens)
  bool echo = false;                 // the prompt leads each choice's text (and logprobs)
  // /v1/chat/completions
  nlohmann::ordered_json messages;  // validated by the encoder in build_prompt
  nlohmann::ordered_json tools;     // null when none (or tool_choice "none")
  nlohmann::ordered_json response_format;
  chat::Mode mode = chat::Mode::Chat;
  std::string reasoning_effort;     // "", "high" or "max" (DeepSeek-V4's two levels)
  std::string tool_choice = "auto"; // "auto", "none", "required" or "function" (the named form)
  std::string tool_name;            // tool_choice "function": the function it names
  std::optional<GrammarSpec> format;  // the structured output asked for, if any

  std::optional<int64_t> max_tokens;
  SamplingParams sampling;
  bool seed_given = false;
  int n = 1, best_of = 1;  // choices returned per prompt; candidates generated per prompt (best n kept)
  std::vector<std::string> stop;
  bool stream = false, include_usage = false, ignore_eos = false;
  std::vector<int32_t> stop_token_ids;  // end like EOS
  int64_t min_tokens = 0;               // EOS and stop ids are not sampled before this many tokens
  int logprobs = -1;  // -1: off; else how many top alternatives per token (0..20)
  std::vector<std::string> unknown_fields;  // top-level fields this server does not read
};

struct ParseResult {
  std::optional<ApiRequest> request;
  std::optional<ApiError> error;
};

// Body (JSON text) -> request or error. Never throws.
ParseResult parse_request(std::string_view body, Endpoint ep, const RequestDefaults& defaults);

// The prompt's token ids and the generation budget, checked against the context.
struct Prompt {
  std::vector<int32_t> tokens;
  int64_t max_tokens = 0;
};
struct PromptResult {
  std::optional<Prompt> prompt;
  std::optional<ApiError> error;
};
// Encodes the prompt (chat: DeepSeek-V4 chat encoding) and checks prompt + max_tokens against
// ctx. A missing max_tokens is completions_max_tokens (completions) or the rest of the context
// (chat). Never throws.
PromptResult build_prompt(const ApiRequest& r, const Tokenizer& tok, int64_t ctx, const RequestDefaults& d);
// Every prompt of the request (completions' prompt lists; one for chat), each as build_prompt
// makes it; also checks logit_bias ids against the vocabulary. Never throws.
struct PromptsResult {
  std::vector<Prompt> prompts;
  std::optional<ApiError> error;
};
PromptsResult build_prompts(const ApiRequest& r, const Tokenizer& tok, int64_t ctx, const RequestDefaults& d);
// The prompt text of a chat request (DeepSeek-V4 encoding with its tools, response_format and
// thinking mode), as build_prompt encodes it; /tokenize renders messages with it too. Throws
// cm::Error on messages the encoder refuses.
std::string render_chat(const ApiRequest& r);

// /tokenize and /detokenize bodies (vLLM shapes; llama-server's "content" is accepted too).
struct TokenizeRequest {
  std::optional<std::string> text;           // "prompt" or "content"
  std::optional<ApiRequest> chat;             // or "messages", parsed as a chat request is
  bool add_special = false;                   // "add_special_tokens"
};
struct TokenizeParse {
  std::optional<TokenizeRequest> request;
  std::optional<ApiError> error;
};
TokenizeParse parse_tokenize(std::string_view body);
struct DetokenizeParse {
  std::vector<int32_t> tokens;
  std::optional<ApiError> error;
};
DetokenizeParse parse_detokenize(std::string_view body, int64_t vocab);

// {"error": {...}} text of an ApiError.
std::string error_json(const ApiError& e);

}  // namespace cm::serve
