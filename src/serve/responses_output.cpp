// ResponsesResponder (see responses.h): the "response" object and its streamed events. One state
// machine serves both: consume() runs the same steps as stream() with the events left unwritten,
// so a streamed answer and a plain one have the same output items, ids and texts.
#include "serve/responses.h"

#include <fmt/format.h>

namespace cm::serve {

using Json = nlohmann::ordered_json;

namespace {
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }
}  // namespace

ResponsesResponder::ResponsesResponder(const ResponsesRequest& req, ResponseMeta meta, const Tokenizer&)
    : req_(req), meta_(std::move(meta)), chat_(req.chat.mode) {
  // Item ids share the response id's random part: "resp_X" -> "msg_X", "rs_X", "fc_X_0".
  const size_t us = meta_.id.find('_');
  hex_ = us == std::string::npos ? meta_.id : meta_.id.substr(us + 1);
}

std::string ResponsesResponder::event(const char* type, Json j) {
  if (!streaming_) return "";
  Json e = {{"type", type}};
  for (auto& [k, v] : j.items()) e[k] = std::move(v);
  e["sequence_number"] = seq_++;
  return fmt::format("event: {}\ndata: {}\n\n", type, dump(e));
}

Json ResponsesResponder::reasoning_item(const char* status, bool with_text) const {
  Json content = Json::array();
  if (with_text) content.push_back({{"type", "reasoning_text"}, {"text", reasoning_}});
  return {{"id", "rs_" + hex_}, {"type", "reasoning"}, {"summary", Json::array()}, {"content", content},
          {"status", status}};
}

Json ResponsesResponder::message_item(const char* status, bool with_text) const {
  Json content = Json::array();
  if (with_text) content.push_back(text_part(content_));
  return {{"id", "msg_" + hex_}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", content}};
}

Json ResponsesResponder::text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}, {"logprobs", Json::array()}};
}

Json ResponsesResponder::call_item(size_t i, const char* status, bool with_arguments) const {
  return {{"id", fmt::format("fc_{}_{}", hex_, i)},
          {"type", "function_call"},
          {"status", status},
          {"call_id", fmt::format("call_{}_{}", hex_, i)},
          {"name", calls_[i].name},
          {"arguments", with_arguments ? calls_[i].arguments : std::string()}};
}

std::string ResponsesResponder::open_reasoning() {
  reasoning_index_ = n_items_++;
  reasoning_open_ = true;
  std::string out = event("response.output_item.added", {{"output_index", reasoning_index_},
                                                         {"item", reasoning_item("in_progress", false)}});
  out += event("response.content_part.added", {{"item_id", "rs_" + hex_},
                                               {"output_index", reasoning_index_},
                                               {"content_index", 0},
                                               {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
  return out;
}

std::string ResponsesResponder::close_reasoning(bool complete) {
  reasoning_open_ = false;
  reasoning_complete_ = complete;
  const std::string id = "rs_" + hex_;
  std::string out = event("response.reasoning_text.done", {{"item_id", id},
                                                           {"output_index", reasoning_index_},
                                                           {"content_index", 0},
                                                           {"text", reasoning_}});
  out += event("response.content_part.done", {{"item_id", id},
                                              {"output_index", reasoning_index_},
                                              {"content_index", 0},
                                              {"part", {{"type", "reasoning_text"}, {"text", reasoning_}}}});
  out += event("response.output_item.done", {{"output_index", reasoning_index_},
                                             {"item", reasoning_item(complete ? "completed" : "incomplete", true)}});
  return out;
}

std::string ResponsesResponder::open_message() {
  message_index_ = n_items_++;
  message_open_ = true;
  std::string out = event("response.output_item.added", {{"output_index", message_index_},
                                                         {"item", message_item("in_progress", false)}});
  out += event("response.content_part.added",
               {{"item_id", "msg_" + hex_}, {"output_index", message_index_}, {"content_index", 0},
                {"part", text_part("")}});
  return out;
}

std::string ResponsesResponder::close_message() {
  message_open_ = false;
  const std::string id = "msg_" + hex_;
  std::string out = event("response.output_text.done", {{"item_id", id},
                                                         {"output_index", message_index_},
                                                         {"content_index", 0},
                                                         {"text", content_},
                                                         {"logprobs", Json::array()}});
  out += event("response.content_part.done",
               {{"item_id", id}, {"output_index", message_index_}, {"content_index", 0}, {"part", text_part(content_)}});
  out += event("response.output_item.done",
               {{"output_index", message_index_}, {"item", message_item(item_status(), true)}});
  return out;
}

const char* ResponsesResponder::item_status() const {
  return status_ == "incomplete" ? "incomplete" : "completed";
}

std::string ResponsesResponder::push_delta(const ChatStreamer::Delta& d) {
  std::string out;
  if (!d.reasoning.empty()) {
    if (reasoning_index_ < 0) out += open_reasoning();
    reasoning_ += d.reasoning;
    out += event("response.reasoning_text.delta",
                 {{"item_id", "rs_" + hex_}, {"output_index", reasoning_index_}, {"content_index", 0},
                  {"delta", d.reasoning}});
  }
  if (!d.content.empty()) {
    if (reasoning_open_) out += close_reasoning(true);  // the answer began: the thinking is over
    if (message_index_ < 0) out += open_message();
    content_ += d.content;
    out += event("response.output_text.delta", {{"item_id", "msg_" + hex_},
                                                {"output_index", message_index_},
                                                {"content_index", 0},
                                                {"delta", d.content},
                                                {"logprobs", Json::array()}});
  }
  return out;
}

// Thinking mode: the tokens up to the one that completes "</think>" count as reasoning tokens
// (each Token event is one token; its text may lag behind while a stop string is held back).
void ResponsesResponder::count_reasoning_token(const JobEvent& e) {
  if (req_.chat.mode != chat::Mode::Thinking || thinking_over_) return;
  ++reasoning_tokens_;
  const size_t from = thought_.size() >= chat::kThinkEnd.size() ? thought_.size() - chat::kThinkEnd.size() + 1 : 0;
  thought_ += e.text;
  if (thought_.find(chat::kThinkEnd, from) != std::string::npos) {
    thinking_over_ = true;
    thought_.clear();
  }
}

std::string ResponsesResponder::stream_start() {
  streaming_ = true;
  // (Sequenced statements: the operands of + may be evaluated in either order.)
  std::string out = event("response.created", {{"response", response_json()}});
  out += event("response.in_progress", {{"response", response_json()}});
  return out;
}

std::string ResponsesResponder::stream(const JobEvent& e) {
  streaming_ = true;
  if (e.kind == JobEvent::Token) {
    count_reasoning_token(e);
    return push_delta(chat_.push(e.text));
  }
  return finish(e);
}

void ResponsesResponder::consume(const JobEvent& e) {
  streaming_ = false;
  if (e.kind == JobEvent::Token) {
    count_reasoning_token(e);
    push_delta(chat_.push(e.text));
    return;
  }
  finish(e);
}

std::string ResponsesResponder::finish(const JobEvent& e) {
  done_ = true;
  prompt_tokens_ = e.prompt_tokens;
  completion_tokens_ = e.completion_tokens;
  cached_tokens_ = e.cached_tokens;
  if (e.finish_reason == "error" || e.finish_reason == "cancelled") {
    error_ = e.finish_reason == "error" ? e.error : "the request was cancelled";
    finish_reason_ = e.finish_reason;
    status_ = "failed";
    return event("response.failed", {{"response", response_json()}});
  }
  std::string out;
  if (!e.text.empty()) out += push_delta(chat_.push(e.text));
  ChatStreamer::Final f = chat_.finish(e.eos);
  status_ = e.finish_reason == "length" ? "incomplete" : "completed";
  out += push_delta(f.delta);
  calls_ = std::move(f.tool_calls);
  finish_reason_ = calls_.empty() ? e.finish_reason : "tool_calls";
  // The thinking is complete unless the budget ran out inside it.
  if (reasoning_open_) out += close_reasoning(status_ == "completed");
  if (message_index_ < 0 && (!content_.empty() || calls_.empty())) out += open_message();
  if (message_open_) out += close_message();
  for (size_t i = 0; i < calls_.size(); ++i) {
    const int index = n_items_++;
    const std::string id = fmt::format("fc_{}_{}", hex_, i);
    out += event("response.output_item.added", {{"output_index", index}, {"item", call_item(i, "in_progress", false)}});
    out += event("response.function_call_arguments.delta",
                 {{"item_id", id}, {"output_index", index}, {"delta", calls_[i].arguments}});
    out += event("response.function_call_arguments.done",
                 {{"item_id", id}, {"output_index", index}, {"arguments", calls_[i].arguments}});
    out += event("response.output_item.done", {{"output_index", index}, {"item", call_item(i, "completed", true)}});
  }
  out += event(status_ == "completed" ? "response.completed" : "response.incomplete", {{"response", response_json()}});
  return out;
}

Json ResponsesResponder::response_json() const {
  Json output = Json::array();
  if (done_ && !failed()) {
    // Ordered by output_index (reasoning, then the message, then the calls).
    if (reasoning_index_ >= 0) output.push_back(reasoning_item(reasoning_complete_ ? "completed" : "incomplete", true));
    if (message_index_ >= 0) output.push_back(message_item(item_status(), true));
    for (size_t i = 0; i < calls_.size(); ++i) output.push_back(call_item(i, "completed", true));
  }
  const ResponsesRequest& q = req_;
  Json r = {{"id", meta_.id},
            {"object", "response"},
            {"created_at", meta_.created},
            {"status", status_},
            {"background", false},
            {"error", failed() ? Json{{"code", "server_error"}, {"message", error_}} : Json()},
            {"incomplete_details", status_ == "incomplete" ? Json{{"reason", "max_output_tokens"}} : Json()},
            {"instructions", q.echo.value("instructions", Json())},
            {"max_output_tokens", q.echo.value("max_output_tokens", Json())},
            {"metadata", q.echo.value("metadata", Json::object())},
            {"model", meta_.model},
            {"output", std::move(output)},
            {"parallel_tool_calls", q.echo.value("parallel_tool_calls", true)},
            {"previous_response_id", nullptr},
            {"reasoning", q.echo.value("reasoning", Json())},
            {"store", false},
            {"temperature", q.chat.sampling.temperature},
            {"text", q.echo.value("text", Json())},
            {"tool_choice", q.echo.value("tool_choice", Json("auto"))},
            {"tools", q.echo.value("tools", Json::array())},
            {"top_p", q.chat.sampling.top_p},
            {"truncation", "disabled"},
            {"usage", Json()},
            {"user", q.echo.value("user", Json())}};
  if (done_ && !failed())
    r["usage"] = {{"input_tokens", prompt_tokens_},
                  // cache_write_tokens: the current openai client's schema requires it; this
                  // server does not count cache writes apart.
                  {"input_tokens_details", {{"cached_tokens", cached_tokens_}, {"cache_write_tokens", 0}}},
                  {"output_tokens", completion_tokens_},
                  {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}},
                  {"total_tokens", prompt_tokens_ + completion_tokens_}};
  return r;
}

std::string ResponsesResponder::body() const { return dump(response_json()); }

}  // namespace cm::serve
