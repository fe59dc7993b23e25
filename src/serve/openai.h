// OpenAI response bodies for one request: the Responder turns the engine's JobEvents into either
// SSE chunks (stream) or one JSON body (non-stream), for /v1/completions and
// /v1/chat/completions. Pure (no network, no engine), so the chat streaming path — reasoning
// apart from content, DSML tool calls, finish reasons, usage, logprobs — is unit-tested on
// scripted model outputs.
//
// Streams follow OpenAI: chat chunks are "chat.completion.chunk" objects whose first delta
// carries the role; reasoning arrives in delta.reasoning_content (DeepSeek API field) and, with
// the same text, delta.reasoning (vLLM 0.10+); the message has both too;
// tool calls come in one delta with finish_reason "tool_calls"; with
// stream_options.include_usage a last chunk has empty choices and the usage; then
// "data: [DONE]". A generation error ends the stream with a data: {"error": ...} event.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "serve/chat_stream.h"
#include "runtime/engine.h"
#include "serve/request.h"

namespace cm::serve {

// The engine's job and event types, which the server fills and relays.
using runtime::Job;
using runtime::JobEvent;
using runtime::JobSpec;
using runtime::TokenOut;
using runtime::TopLogprob;

struct ResponseMeta {
  std::string id;     // "cmpl-…" / "chatcmpl-…"
  int64_t created = 0;
  std::string model;  // served model name
};

class Responder {
 public:
  Responder(const ApiRequest& req, ResponseMeta meta, const Tokenizer& tok);
  // One choice of several (serve/choices.h): chunks carry `index`, and the stream's usage chunk
  // and [DONE] are left to the caller, which merges the choices.
  void set_choice(int index) {
    index_ = index;
    solo_ = false;
  }
  // echo (completions): the prompt text leads the choice's text, and with logprobs the prompt
  // tokens' logprobs (the first event's JobEvent::prompt_logprobs) lead its logprobs.
  void set_echo(std::string prompt_text) {
    echo_ = std::move(prompt_text);
    echo_pending_ = true;
  }
  // Streaming: the SSE text for this event (possibly empty); after Finish it ends with
  // "data: [DONE]\n\n".
  std::string stream(const JobEvent& e);
  // Non-streaming: consume the event; once done(), body() is the response JSON (or, when
  // failed(), the error's message is in error()).
  void consume(const JobEvent& e);
  bool done() const { return done_; }
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  std::string body() const;
  // The opening SSE chunk (chat: the assistant role), sent before any token.
  std::string stream_start();
  std::string finish_reason() const { return finish_reason_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  int64_t cached_tokens() const { return cached_tokens_; }
  // Sum of the generated tokens' raw logprobs (best_of ranks candidates by it; the job must have
  // asked for logprobs).
  double cumulative_logprob() const { return cumulative_logprob_; }
  // The choice object of body() (non-streaming).
  nlohmann::ordered_json choice_json() const;

 private:
  nlohmann::ordered_json chunk(nlohmann::ordered_json choice) const;
  nlohmann::ordered_json usage() const;
  nlohmann::ordered_json chat_logprobs(const std::vector<TokenOut>& toks) const;
  void add_completion_logprobs(const std::vector<TokenOut>& toks, const std::string& text);
  // Puts the echo (prompt text; prompt logprobs) in front of the first event's text and tokens.
  void take_echo(const JobEvent& e, std::string* text, std::vector<TokenOut>* toks);
  std::string finish_chat(const JobEvent& e, bool streaming);

  const ApiRequest& req_;
  ResponseMeta meta_;
  const Tokenizer& tok_;
  ChatStreamer chat_;
  bool done_ = false;
  int index_ = 0;
  bool solo_ = true;
  std::string echo_;
  bool echo_pending_ = false;
  double cumulative_logprob_ = 0;
  std::string error_, finish_reason_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
  // Non-stream accumulation.
  std::string text_;
  nlohmann::ordered_json logprobs_;   // completions: {tokens, token_logprobs, top_logprobs, text_offset}
  nlohmann::ordered_json chat_lp_;    // chat: [{token, logprob, bytes, top_logprobs}]
  ChatStreamer::Final final_;
};

// "data: <json>\n\n"
std::string sse(const nlohmann::ordered_json& j);

}  // namespace cm::serve
