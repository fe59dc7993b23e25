// OpenAI's Responses API (POST /v1/responses) on top of the chat-completions path: a request is
// translated into the chat request it means (input items -> DeepSeek-V4 chat messages, flat
// function tools -> chat tools, text.format -> response_format, reasoning.effort -> thinking mode)
// and parsed by the chat parser, so validation, prompt rendering, sampling and the engine job are
// exactly the chat endpoint's (with temperature 0 both answer the same text). Only the bodies
// differ: ResponsesResponder turns the engine's JobEvents into a "response" object or its typed
// SSE events. Pure functions and classes (no network, no engine), unit-tested in
// tests/test_serve_responses.cpp.
//
// Request fields: model, input (a string, or items: messages {"role": user|system|developer|
// assistant, "content": str | [{"type": "input_text"|"output_text"|"text", "text"}]},
// {"type": "function_call", call_id, name, arguments}, {"type": "function_call_output", call_id,
// output}, {"type": "reasoning", content|summary} carried onto the next assistant turn),
// instructions (a system message first), tools ({"type": "function", name, description,
// parameters, strict}), tool_choice ("auto"|"none"|"required"|{"type": "function", "name"}: the
// latter as "required"), max_output_tokens, temperature, top_p, stream, reasoning.effort (none/
// minimal: no thinking; low/medium/high: thinking; xhigh/max: thinking at effort max), text.format
// (text|json_object|json_schema -> chat's response_format), parallel_tool_calls, metadata, user,
// store (nothing is stored), seed, and the chat endpoint's extensions (top_k, min_p,
// presence_penalty, frequency_penalty, repetition_penalty, ignore_eos, min_tokens,
// stop_token_ids). previous_response_id is a 400 (no stored responses). Other fields are unknown_fields (the server's usual policy).
//
// Streamed events (`event: TYPE` + `data: JSON`, each with a growing sequence_number):
//   response.created, response.in_progress,
//   [reasoning] response.output_item.added, response.content_part.added (reasoning_text),
//               response.reasoning_text.delta..., response.reasoning_text.done,
//               response.content_part.done, response.output_item.done
//   [message]   response.output_item.added, response.content_part.added (output_text),
//               response.output_text.delta..., response.output_text.done,
//               response.content_part.done, response.output_item.done
//   [per call]  response.output_item.added, response.function_call_arguments.delta,
//               response.function_call_arguments.done, response.output_item.done
//   response.completed | response.incomplete (max_output_tokens) | response.failed (engine error)
// The message item is there when the answer has text or no tool calls, the reasoning item when
// thinking produced reasoning; the streamed deltas add up to the final object's texts.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "serve/chat_stream.h"
#include "serve/openai.h"
#include "serve/request.h"

namespace cm::serve {

struct ResponsesRequest {
  ApiRequest chat;                    // the chat request the job runs (endpoint Chat)
  nlohmann::ordered_json chat_body;   // the chat-completions body it was parsed from (for tests and logs)
  // Echoed in the response object as OpenAI does: instructions, max_output_tokens, tools (as the
  // client sent them), tool_choice, parallel_tool_calls, text, reasoning, metadata, user, store.
  nlohmann::ordered_json echo;
};

struct ResponsesParse {
  std::optional<ResponsesRequest> request;
  std::optional<ApiError> error;
};

// Body (JSON text) -> request or an ApiError naming the Responses field (e.g. "input[2].content").
// Never throws.
ResponsesParse parse_responses_request(std::string_view body, const RequestDefaults& defaults);

// An error of the shared chat path (build_prompt) in the Responses API's words: "messages" is
// "input", "max_tokens" is "max_output_tokens".
ApiError responses_error(ApiError e);

// The Responder of /v1/responses: same interface as Responder (the HTTP layer relays both alike).
class ResponsesResponder {
 public:
  ResponsesResponder(const ResponsesRequest& req, ResponseMeta meta, const Tokenizer& tok);
  // Streaming: response.created and response.in_progress.
  std::string stream_start();
  // Streaming: the SSE events for this engine event (possibly none).
  std::string stream(const JobEvent& e);
  // Non-streaming: consume the event; once done(), body() is the response object.
  void consume(const JobEvent& e);
  bool done() const { return done_; }
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  std::string body() const;
  std::string finish_reason() const { return finish_reason_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  // The response object as it stands ("in_progress" until the Finish event).
  nlohmann::ordered_json response_json() const;

 private:
  // "event: TYPE\ndata: {...}\n\n" with the next sequence_number; "" when not streaming.
  std::string event(const char* type, nlohmann::ordered_json j);
  std::string push_delta(const ChatStreamer::Delta& d);
  std::string open_reasoning();
  std::string close_reasoning(bool complete);
  std::string open_message();
  std::string close_message();
  std::string finish(const JobEvent& e);
  void count_reasoning_token(const JobEvent& e);
  const char* item_status() const;  // the message's final status
  nlohmann::ordered_json reasoning_item(const char* status, bool with_text) const;
  nlohmann::ordered_json message_item(const char* status, bool with_text) const;
  static nlohmann::ordered_json text_part(const std::string& text);
  nlohmann::ordered_json call_item(size_t i, const char* status, bool with_arguments) const;

  const ResponsesRequest& req_;
  ResponseMeta meta_;
  std::string hex_;  // the id's random part, shared by the item ids
  ChatStreamer chat_;
  int64_t seq_ = 0;
  bool streaming_ = false;
  bool done_ = false;
  std::string error_, finish_reason_, status_ = "in_progress";
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0, reasoning_tokens_ = 0;
  // Thinking-mode token accounting: tokens up to the one that completes "</think>" are reasoning.
  std::string thought_;
  bool thinking_over_ = false;
  // The answer so far (streamed deltas; the final split once done).
  std::string reasoning_, content_;
  std::vector<chat::ToolCall> calls_;
  // Output items in order: which exist, their index in "output", and whether they are closed.
  int reasoning_index_ = -1, message_index_ = -1, n_items_ = 0;
  bool reasoning_open_ = false, message_open_ = false, reasoning_complete_ = false;
};

}  // namespace cm::serve
