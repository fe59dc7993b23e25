// OpenAI response bodies (see openai.h).
#include "serve/openai.h"

#include <fmt/format.h>

#include <cmath>

#include "tokenizer/tokenizer.h"

namespace cm::serve {

using Json = nlohmann::ordered_json;

std::string sse(const Json& j) {
  return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
}

namespace {
// Reasoning goes out under both names: reasoning_content (DeepSeek API, vLLM before 0.10, most
// clients) and reasoning (vLLM 0.10+, OpenRouter), so a client reading either finds it.
void set_reasoning(Json& j, const std::string& text) {
  j["reasoning_content"] = text;
  j["reasoning"] = text;
}

Json token_bytes_json(const std::string& b) {
  Json a = Json::array();
  for (unsigned char c : b) a.push_back(int(c));
  return a;
}

Json tool_calls_json(const std::vector<chat::ToolCall>& calls, const std::string& id, bool with_index) {
  Json a = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json c;
    if (with_index) c["index"] = i;
    c["id"] = fmt::format("call_{}_{}", id, i);
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    a.push_back(std::move(c));
  }
  return a;
}
}  // namespace

Responder::Responder(const ApiRequest& req, ResponseMeta meta, const Tokenizer& tok)
    : req_(req), meta_(std::move(meta)), tok_(tok), chat_(req.mode) {
  if (req_.logprobs >= 0) {
    logprobs_ = {{"tokens", Json::array()},
                 {"token_logprobs", Json::array()},
                 {"top_logprobs", Json::array()},
                 {"text_offset", Json::array()}};
    chat_lp_ = Json::array();
  }
}

Json Responder::chunk(Json choice) const {
  const bool chat = req_.endpoint == Endpoint::Chat;
  Json c = {{"id", meta_.id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta_.created},
            {"model", meta_.model},
            {"choices", Json::array()}};
  if (!choice.is_null()) c["choices"].push_back(std::move(choice));
  return c;
}

Json Responder::usage() const {
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", prompt_tokens_ + completion_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
}

Json Responder::chat_logprobs(const std::vector<TokenOut>& toks) const {
  Json content = Json::array();
  for (const TokenOut& t : toks) {
    const std::string& b = tok_.token_bytes(t.id);
    Json top = Json::array();
    for (const TopLogprob& a : t.top) {
      const std::string& ab = tok_.token_bytes(a.id);
      top.push_back({{"token", utf8_sanitize(ab)}, {"logprob", a.logprob}, {"bytes", token_bytes_json(ab)}});
    }
    content.push_back(
        {{"token", utf8_sanitize(b)}, {"logprob", t.logprob}, {"bytes", token_bytes_json(b)}, {"top_logprobs", top}});
  }
  return content;
}

void Responder::add_completion_logprobs(const std::vector<TokenOut>& toks, const std::string& text) {
  size_t offset = text_.size() - text.size();
  for (const TokenOut& t : toks) {
    const std::string& b = tok_.token_bytes(t.id);
    logprobs_["tokens"].push_back(utf8_sanitize(b));
    // An echoed prompt's first token has no logprob (nothing before it): null, as OpenAI.
    const bool none = std::isnan(t.logprob);
    logprobs_["token_logprobs"].push_back(none ? Json() : Json(t.logprob));
    Json top = none ? Json() : Json::object();
    for (const TopLogprob& a : t.top) top[utf8_sanitize(tok_.token_bytes(a.id))] = a.logprob;
    logprobs_["top_logprobs"].push_back(top);
    logprobs_["text_offset"].push_back(offset);
    offset += b.size();
  }
}

void Responder::take_echo(const JobEvent& e, std::string* text, std::vector<TokenOut>* toks) {
  if (!echo_pending_) return;
  echo_pending_ = false;
  *text = echo_ + e.text;
  toks->clear();
  if (req_.logprobs >= 0) *toks = e.prompt_logprobs;
  toks->insert(toks->end(), e.tokens.begin(), e.tokens.end());
}

std::string Responder::stream_start() {
  if (req_.endpoint != Endpoint::Chat) return "";
  return sse(chunk({{"index", index_},
                    {"delta", {{"role", "assistant"}, {"content", ""}}},
                    {"logprobs", nullptr},
                    {"finish_reason", nullptr}}));
}

std::string Responder::finish_chat(const JobEvent& e, bool streaming) {
  final_ = chat_.finish(e.eos);
  finish_reason_ = final_.tool_calls.empty() ? e.finish_reason : "tool_calls";
  if (!streaming) return "";
  std::string out;
  Json delta = Json::object();
  if (!final_.delta.reasoning.empty()) set_reasoning(delta, final_.delta.reasoning);
  if (!final_.delta.content.empty()) delta["content"] = final_.delta.content;
  if (!final_.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(final_.tool_calls, meta_.id, true);
  out += sse(chunk({{"index", index_}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish_reason_}}));
  return out;
}

std::string Responder::stream(const JobEvent& e) {
  const bool chat = req_.endpoint == Endpoint::Chat;
  const bool want_lp = req_.logprobs >= 0 && !e.tokens.empty();
  if (e.kind == JobEvent::Token) {
    if (chat) {
      ChatStreamer::Delta d = chat_.push(e.text);
      if (d.reasoning.empty() && d.content.empty() && !want_lp) return "";
      Json delta = Json::object();
      if (!d.reasoning.empty()) set_reasoning(delta, d.reasoning);
      if (!d.content.empty() || d.reasoning.empty()) delta["content"] = d.content;
      Json lp = want_lp ? Json{{"content", chat_logprobs(e.tokens)}} : Json();
      return sse(chunk({{"index", index_}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", nullptr}}));
    }
    std::string text = e.text;
    std::vector<TokenOut> toks = e.tokens;
    take_echo(e, &text, &toks);
    text_ += text;
    if (text.empty() && !want_lp) return "";
    Json lp;
    if (want_lp) {
      logprobs_ = {{"tokens", Json::array()},
                   {"token_logprobs", Json::array()},
                   {"top_logprobs", Json::array()},
                   {"text_offset", Json::array()}};
      add_completion_logprobs(toks, text);
      lp = logprobs_;
    }
    return sse(chunk({{"index", index_}, {"text", text}, {"logprobs", lp}, {"finish_reason", nullptr}}));
  }
  // Finish.
  done_ = true;
  prompt_tokens_ = e.prompt_tokens;
  completion_tokens_ = e.completion_tokens;
  cached_tokens_ = e.cached_tokens;
  std::string out;
  if (e.finish_reason == "error" || e.finish_reason == "cancelled") {
    error_ = e.finish_reason == "error" ? e.error : "the request was cancelled";
    out += sse(Json{{"error", {{"message", error_}, {"type", "server_error"}, {"param", nullptr}, {"code", 500}}}});
  } else if (chat) {
    if (!e.text.empty()) {
      ChatStreamer::Delta d = chat_.push(e.text);
      Json delta = Json::object();
      if (!d.reasoning.empty()) set_reasoning(delta, d.reasoning);
      if (!d.content.empty()) delta["content"] = d.content;
      if (!delta.empty())
        out += sse(chunk({{"index", index_}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
    }
    out += finish_chat(e, true);
  } else {
    finish_reason_ = e.finish_reason;
    text_ += e.text;
    out += sse(chunk({{"index", index_}, {"text", e.text}, {"logprobs", nullptr}, {"finish_reason", finish_reason_}}));
  }
  if (!solo_) return out;  // the caller merges the choices' ends
  if (req_.include_usage && error_.empty()) {
    Json u = chunk(Json());
    u["usage"] = usage();
    out += sse(u);
  }
  out += "data: [DONE]\n\n";
  return out;
}

void Responder::consume(const JobEvent& e) {
  const bool chat = req_.endpoint == Endpoint::Chat;
  for (const TokenOut& t : e.tokens) cumulative_logprob_ += t.logprob;
  std::string text = e.text;
  std::vector<TokenOut> toks = e.tokens;
  if (e.kind == JobEvent::Token && !chat) take_echo(e, &text, &toks);
  if (e.kind == JobEvent::Token || !text.empty()) {
    if (chat) {
      chat_.push(text);
    } else {
      text_ += text;
    }
  }
  if (req_.logprobs >= 0 && !toks.empty()) {
    if (chat) {
      for (auto& c : chat_logprobs(toks)) chat_lp_.push_back(c);
    } else {
      add_completion_logprobs(toks, text);
    }
  }
  if (e.kind != JobEvent::Finish) return;
  done_ = true;
  prompt_tokens_ = e.prompt_tokens;
  completion_tokens_ = e.completion_tokens;
  cached_tokens_ = e.cached_tokens;
  if (e.finish_reason == "error" || e.finish_reason == "cancelled") {
    error_ = e.finish_reason == "error" ? e.error : "the request was cancelled";
    return;
  }
  if (chat) finish_chat(e, false);
  else finish_reason_ = e.finish_reason;
}

Json Responder::choice_json() const {
  const bool chat = req_.endpoint == Endpoint::Chat;
  Json choice = {{"index", index_}};
  if (chat) {
    Json msg = {{"role", "assistant"}};
    msg["content"] = final_.content.empty() && !final_.tool_calls.empty() ? Json() : Json(final_.content);
    if (req_.mode == chat::Mode::Thinking) set_reasoning(msg, final_.reasoning);
    if (!final_.tool_calls.empty()) msg["tool_calls"] = tool_calls_json(final_.tool_calls, meta_.id, false);
    choice["message"] = msg;
    choice["logprobs"] = req_.logprobs >= 0 ? Json{{"content", chat_lp_}} : Json();
  } else {
    choice["text"] = text_;
    choice["logprobs"] = req_.logprobs >= 0 ? logprobs_ : Json();
  }
  choice["finish_reason"] = finish_reason_;
  return choice;
}

std::string Responder::body() const {
  const bool chat = req_.endpoint == Endpoint::Chat;
  Json choice = choice_json();
  Json r = {{"id", meta_.id},
            {"object", chat ? "chat.completion" : "text_completion"},
            {"created", meta_.created},
            {"model", meta_.model},
            {"choices", Json::array({choice})},
            {"usage", usage()}};
  return r.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace cm::serve
