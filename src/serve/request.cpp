// Request parsing for the server (see request.h). Every check produces an ApiError naming the
// field; internally a thrown Bad carries it up to the one catch in each public function, which
// also turns any cm::Error (the chat encoder's, the tokenizer's) or std::exception into a 400.
#include "serve/request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace cm::serve {

namespace {
using Json = nlohmann::ordered_json;

constexpr int kMaxDepth = 64;      // JSON nesting a request may have (the encoder recurses)
constexpr size_t kMaxStops = 16;
constexpr size_t kMaxStopIds = 64;
constexpr int kMaxLogprobs = 20;
constexpr int64_t kMaxN = 16;            // n and best_of
constexpr size_t kMaxPrompts = 32;       // prompts in a completions request's list
constexpr int64_t kMaxSequences = 64;    // prompts × best_of: the jobs one request may queue
constexpr size_t kMaxLogitBias = 1024;   // logit_bias entries

struct Bad {
  ApiError e;
};
[[noreturn]] void bad(std::string param, std::string msg, int status = 400) {
  throw Bad{ApiError{status, "invalid_request_error", std::move(msg), std::move(param)}};
}

// Deepest bracket nesting of a JSON text, outside strings (checked before parsing so no deeply
// nested value ever reaches a recursive consumer).
int json_depth(std::string_view s) {
  int depth = 0, worst = 0;
  bool in_str = false, esc = false;
  for (char c : s) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '[' || c == '{') worst = std::max(worst, ++depth);
    else if (c == ']' || c == '}') --depth;
  }
  return worst;
}

Json parse_object(std::string_view body) {
  if (json_depth(body) > kMaxDepth) bad("", fmt::format("request JSON is nested deeper than {} levels", kMaxDepth));
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad("", "request body is not valid JSON");
  if (!j.is_object()) bad("", "request body must be a JSON object");
  return j;
}

bool has(const Json& j, const char* k) { return j.contains(k) && !j[k].is_null(); }

double number(const Json& j, const char* k, double lo, double hi, bool lo_open = false) {
  const Json& v = j[k];
  if (!v.is_number()) bad(k, fmt::format("'{}' must be a number", k));
  double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
    bad(k, fmt::format("'{}' must be in {}{}, {}] (got {})", k, lo_open ? "(" : "[", lo, hi, x));
  return x;
}

int64_t integer(const Json& j, const char* k, int64_t lo, int64_t hi) {
  const Json& v = j[k];
  if (!v.is_number_integer()) bad(k, fmt::format("'{}' must be an integer", k));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    bad(k, fmt::format("'{}' is out of range", k));
  int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad(k, fmt::format("'{}' must be in [{}, {}] (got {})", k, lo, hi, x));
  return x;
}

bool boolean(const Json& j, const char* k) {
  if (!j[k].is_boolean()) bad(k, fmt::format("'{}' must be true or false", k));
  return j[k].get<bool>();
}

std::string string(const Json& j, const char* k) {
  if (!j[k].is_string()) bad(k, fmt::format("'{}' must be a string", k));
  return j[k].get<std::string>();
}

void parse_sampling(const Json& j, const RequestDefaults& d, ApiRequest& r) {
  SamplingParams& s = r.sampling;
  s.temperature = d.temperature.value_or(1.0f);
  s.top_p = d.top_p.value_or(1.0f);
  s.top_k = d.top_k.value_or(0);
  s.min_p = d.min_p.value_or(0.0f);
  s.repetition_penalty = d.repetition_penalty.value_or(1.0f);
  if (has(j, "temperature")) s.temperature = float(number(j, "temperature", 0, 2));
  if (has(j, "top_p")) s.top_p = float(number(j, "top_p", 0, 1, true));
  if (has(j, "top_k")) {
    int64_t k = integer(j, "top_k", -1, std::numeric_limits<int32_t>::max());
    s.top_k = k < 0 ? 0 : int(k);
  }
  if (has(j, "min_p")) s.min_p = float(number(j, "min_p", 0, 1));
  if (has(j, "presence_penalty")) s.presence_penalty = float(number(j, "presence_penalty", -2, 2));
  if (has(j, "frequency_penalty")) s.frequency_penalty = float(number(j, "frequency_penalty", -2, 2));
  if (has(j, "repetition_penalty")) s.repetition_penalty = float(number(j, "repetition_penalty", 0, 1e6, true));
  if (has(j, "seed")) {
    const Json& v = j["seed"];
    if (!v.is_number_integer()) bad("seed", "'seed' must be an integer");
    s.seed = v.is_number_unsigned() ? v.get<uint64_t>() : uint64_t(v.get<int64_t>());
    r.seed_given = true;
  }
  try {
    validate_sampling_params(s);
  } catch (const Error& e) {
    bad("", e.what());
  }
}

// OpenAI's shape: {"<token id>": bias}, the id as a decimal string (a JSON object's keys are strings).
void parse_logit_bias(const Json& v, SamplingParams& s) {
  if (!v.is_object()) bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
  if (v.size() > kMaxLogitBias) bad("logit_bias", fmt::format("'logit_bias' may hold at most {} tokens", kMaxLogitBias));
  for (const auto& [key, bias] : v.items()) {
    const bool digits = !key.empty() && key.size() <= 10 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || std::stoll(key) > std::numeric_limits<int32_t>::max())
      bad("logit_bias", fmt::format("'logit_bias' keys must be token ids (non-negative integers), got \"{}\"", key));
    if (!bias.is_number() || !std::isfinite(bias.get<double>()) || bias.get<double>() < -100 || bias.get<double>() > 100)
      bad("logit_bias", fmt::format("'logit_bias' values must be numbers in [-100, 100] (token {}: {})", key,
                                    bias.dump()));
    s.logit_bias.emplace_back(int32_t(std::stoll(key)), float(bias.get<double>()));
  }
}

void parse_common(const Json& j, const RequestDefaults& d, ApiRequest& r) {
  if (has(j, "model")) r.model = string(j, "model");
  const char* mt = r.endpoint == Endpoint::Chat && has(j, "max_completion_tokens") ? "max_completion_tokens"
                                                                                   : "max_tokens";
  if (has(j, mt)) r.max_tokens = integer(j, mt, 1, std::numeric_limits<int32_t>::max());
  parse_sampling(j, d, r);
  if (has(j, "stop")) {
    const Json& v = j["stop"];
    if (v.is_string()) {
      r.stop.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      if (v.size() > kMaxStops) bad("stop", fmt::format("'stop' may hold at most {} strings", kMaxStops));
      for (const Json& s : v) {
        if (!s.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of strings");
    }
  }
  if (has(j, "stream")) r.stream = boolean(j, "stream");
  if (has(j, "n")) r.n = int(integer(j, "n", 1, kMaxN));
  r.best_of = r.n;
  if (has(j, "best_of")) {
    r.best_of = int(integer(j, "best_of", 1, kMaxN));
    if (r.best_of < r.n) bad("best_of", fmt::format("'best_of' ({}) must be at least 'n' ({})", r.best_of, r.n));
    // OpenAI's rule: the best candidates are known only once all have ended.
    if (r.stream && r.best_of > r.n) bad("best_of", "'best_of' greater than 'n' cannot be streamed");
  }
  if (has(j, "logit_bias")) parse_logit_bias(j["logit_bias"], r.sampling);
  if (has(j, "stream_options")) {
    const Json& so = j["stream_options"];
    if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed with stream: true");
    if (has(so, "include_usage")) r.include_usage = boolean(so, "include_usage");
  }
  if (has(j, "ignore_eos")) r.ignore_eos = boolean(j, "ignore_eos");
  // vLLM's extensions: ids that end the answer like EOS, and a floor under its length.
  if (has(j, "stop_token_ids")) {
    const Json& v = j["stop_token_ids"];
    if (!v.is_array()) bad("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    if (v.size() > kMaxStopIds)
      bad("stop_token_ids", fmt::format("'stop_token_ids' may hold at most {} ids", kMaxStopIds));
    for (const Json& t : v) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
        bad("stop_token_ids", "'stop_token_ids' must be an array of token ids");
      r.stop_token_ids.push_back(int32_t(t.get<int64_t>()));
    }
  }
  if (has(j, "min_tokens")) r.min_tokens = integer(j, "min_tokens", 0, std::numeric_limits<int32_t>::max());
}

void parse_completions(const Json& j, ApiRequest& r) {
  if (!j.contains("prompt")) bad("prompt", "'prompt' is required");
  const Json& p = j["prompt"];
  constexpr const char* kShape =
      "'prompt' must be a string, an array of strings, an array of token ids, or an array of token-id arrays";
  auto token_list = [](const Json& a) {
    std::vector<int32_t> ids;
    for (const Json& t : a) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
        bad("prompt", "a token prompt must be an array of non-negative integer ids");
      ids.push_back(int32_t(t.get<int64_t>()));
    }
    return ids;
  };
  if (p.is_string()) {
    r.prompts.push_back({p.get<std::string>(), {}});
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    r.prompts.push_back({std::nullopt, token_list(p)});  // one prompt of token ids
  } else if (p.is_array() && !p.empty()) {
    if (p.size() > kMaxPrompts) bad("prompt", fmt::format("'prompt' may hold at most {} prompts", kMaxPrompts));
    for (const Json& e : p) {
      if (e.is_string()) r.prompts.push_back({e.get<std::string>(), {}});
      else if (e.is_array() && !e.empty()) r.prompts.push_back({std::nullopt, token_list(e)});
      else bad("prompt", kShape);
    }
  } else {
    bad("prompt", kShape);
  }
  r.prompt_text = r.prompts[0].text;
  r.prompt_tokens = r.prompts[0].tokens;
  if (int64_t(r.prompts.size()) * r.best_of > kMaxSequences)
    bad("n", fmt::format("{} prompts × {} choices is more than the {} sequences a request may ask for",
                         r.prompts.size(), r.best_of, kMaxSequences));
  if (has(j, "logprobs")) r.logprobs = int(integer(j, "logprobs", 0, kMaxLogprobs));
  if (has(j, "echo")) r.echo = boolean(j, "echo");
  if (has(j, "suffix")) bad("suffix", "suffix is not supported");
}

void parse_chat(const Json& j, ApiRequest& r) {
  if (!j.contains("messages")) bad("messages", "'messages' is required");
  if (!j["messages"].is_array() || j["messages"].empty()) bad("messages", "'messages' must be a non-empty array");
  for (const Json& m : j["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad("messages", "every message must be an object with a string 'role'");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      bad("messages", fmt::format("unknown message role '{}'", role));
  }
  r.messages = j["messages"];
  std::string tool_choice = "auto";
  const char* tc_shape =
      "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";
  if (has(j, "tool_choice")) {
    const Json& tc = j["tool_choice"];
    if (tc.is_object()) {
      // The named form: the answer must call this function (constrained by serve/structured.h).
      if (tc.value("type", "") != "function" || !tc.contains("function") || !tc["function"].is_object() ||
          !tc["function"].contains("name") || !tc["function"]["name"].is_string())
        bad("tool_choice", tc_shape);
      tool_choice = "function";
      r.tool_name = tc["function"]["name"].get<std::string>();
    } else {
      if (!tc.is_string()) bad("tool_choice", tc_shape);
      tool_choice = tc.get<std::string>();
      if (tool_choice != "auto" && tool_choice != "none" && tool_choice != "required") bad("tool_choice", tc_shape);
    }
  }
  if (has(j, "tools")) {
    const Json& t = j["tools"];
    if (!t.is_array()) bad("tools", "'tools' must be an array");
    for (const Json& f : t)
      if (!f.is_object() || !f.contains("function") || !f["function"].is_object() || !f["function"].contains("name") ||
          !f["function"]["name"].is_string())
        bad("tools", "every tool must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}");
    if (!t.empty() && tool_choice != "none") r.tools = t;
  }
  if (tool_choice == "required" || tool_choice == "function") {
    if (r.tools.is_null()) bad("tool_choice", fmt::format("tool_choice \"{}\" needs a non-empty 'tools'", tool_choice == "function" ? r.tool_name : tool_choice));
    if (tool_choice == "function") {
      bool listed = false;
      for (const Json& f : r.tools) listed |= f["function"]["name"] == r.tool_name;
      if (!listed) bad("tool_choice", fmt::format("tool_choice names '{}', which is not in 'tools'", r.tool_name));
    }
  }
  r.tool_choice = tool_choice;
  if (has(j, "response_format")) {
    const Json& f = j["response_format"];
    if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
      bad("response_format", "'response_format' must be an object with a 'type'");
    if (f["type"] != "text") r.response_format = f;
  }
  std::optional<bool> thinking;
  if (has(j, "chat_template_kwargs")) {
    const Json& k = j["chat_template_kwargs"];
    if (!k.is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (const char* key : {"thinking", "enable_thinking"})
      if (has(k, key)) thinking = boolean(k, key);
  }
  if (has(j, "reasoning_effort")) {
    std::string e = string(j, "reasoning_effort");
    if (e == "low" || e == "medium" || e == "high") r.reasoning_effort = "high";
    else if (e == "max") r.reasoning_effort = "max";
    else bad("reasoning_effort", "'reasoning_effort' must be low, medium, high or max");
    if (!thinking.has_value()) thinking = true;
  }
  r.mode = thinking.value_or(false) ? chat::Mode::Thinking : chat::Mode::Chat;
  if (has(j, "logprobs") && boolean(j, "logprobs")) r.logprobs = 0;
  if (has(j, "top_logprobs")) {
    int n = int(integer(j, "top_logprobs", 0, kMaxLogprobs));
    if (r.logprobs < 0) bad("top_logprobs", "'top_logprobs' needs logprobs: true");
    r.logprobs = n;
  }
}

// The structured output a request asks for (grammar/grammar.h reads OpenAI's, vLLM's and
// llama.cpp's fields); its errors name the field first ("guided_regex: must be a string"), which
// becomes the error's param. A tool_choice that forces a tool call is a grammar of its own, so it
// cannot be combined with another.
void parse_format(const Json& j, ApiRequest& r) {
  try {
    r.format = parse_request_format(nlohmann::json::parse(j.dump()));
  } catch (const Error& e) {
    const std::string msg = e.what();
    bad(msg.substr(0, msg.find_first_of(": ")), msg);
  }
  if (r.format && (r.tool_choice == "required" || r.tool_choice == "function"))
    bad("tool_choice", fmt::format("tool_choice forces a tool call, which cannot be combined with {}", r.format->source));
}

// Runs one parse into a fresh result: a Bad becomes its own error, any other exception a 400
// carrying its message (a request never escapes as a 500 or a crash).
template <typename Out, typename F>
Out guarded(F&& f) {
  Out out;
  try {
    f(out);
  } catch (const Bad& b) {
    out.error = b.e;
  } catch (const std::exception& e) {
    out.error = ApiError{400, "invalid_request_error", e.what(), ""};
  }
  return out;
}

// The chat messages with the request's tools and response_format attached to the system message
// (the DeepSeek-V4 encoding renders them there); a system message is added when there is none.
Json chat_messages(const ApiRequest& r) {
  Json msgs = r.messages;
  if (r.tools.is_null() && r.response_format.is_null()) return msgs;
  if (msgs.empty() || !msgs[0].is_object() || msgs[0].value("role", "") != "system")
    msgs.insert(msgs.begin(), Json{{"role", "system"}, {"content", ""}});
  if (!r.tools.is_null()) msgs[0]["tools"] = r.tools;
  if (!r.response_format.is_null()) msgs[0]["response_format"] = r.response_format;
  return msgs;
}


// The top-level fields this server reads (request.h lists their meaning). `user` is accepted and
// unused, as vLLM does; everything else is "unknown" (logged, or a 400 with --strict-requests).
bool known_field(const std::string& k, Endpoint ep) {
  static const std::set<std::string> common = {
      "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
      "repetition_penalty", "seed", "stop", "n", "best_of", "stream", "stream_options", "ignore_eos", "user",
      "logit_bias", "stop_token_ids", "min_tokens",
      // structured output (parse_format)
      "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
      "json_schema", "grammar"};
  static const std::set<std::string> completions = {"prompt", "logprobs", "echo", "suffix"};
  static const std::set<std::string> chat = {"messages",         "max_completion_tokens", "tools",
                                             "tool_choice",      "response_format",       "chat_template_kwargs",
                                             "reasoning_effort", "logprobs",              "top_logprobs"};
  return common.count(k) || (ep == Endpoint::Chat ? chat : completions).count(k);
}
}  // namespace

ParseResult parse_request(std::string_view body, Endpoint ep, const RequestDefaults& defaults) {
  return guarded<ParseResult>([&](ParseResult& out) {
    Json j = parse_object(body);
    ApiRequest r;
    r.endpoint = ep;
    for (const auto& [k, v] : j.items())
      if (!known_field(k, ep)) r.unknown_fields.push_back(k);
    parse_common(j, defaults, r);
    if (ep == Endpoint::Chat) parse_chat(j, r);
    else parse_completions(j, r);
    parse_format(j, r);
    out.request = std::move(r);
  });
}

std::string render_chat(const ApiRequest& r) {
  chat::ChatOptions co;
  co.mode = r.mode;
  co.reasoning_effort = r.reasoning_effort;
  return chat::encode_messages(chat_messages(r), co);
}

namespace {
// One prompt's tokens and budget (build_prompt's contract); `in` is the completions prompt.
Prompt make_prompt(const ApiRequest& r, const PromptInput& in, const Tokenizer& tok, int64_t ctx,
                   const RequestDefaults& d) {
  Prompt p;
  if (r.endpoint == Endpoint::Chat) {
    try {
      p.tokens = tok.encode(render_chat(r));
    } catch (const Error& e) {
      bad("messages", e.what());
    }
  } else if (in.text) {
    p.tokens = tok.encode(*in.text);
  } else {
    p.tokens = in.tokens;
    for (int32_t t : p.tokens)
      if (t >= tok.vocab_size()) bad("prompt", fmt::format("token id {} is outside the vocabulary of {}", t, tok.vocab_size()));
  }
  if (p.tokens.empty()) bad("prompt", "the prompt encodes to no tokens");
  const int64_t n = int64_t(p.tokens.size());
  // vLLM's (and OpenAI's) wording: clients match "maximum context length is N tokens" to tell
  // an overflow from other 400s and trim their history.
  if (n >= ctx)
    bad("prompt", fmt::format("This model's maximum context length is {} tokens. However, your request has {} input "
                              "tokens (at least one must remain for the completion). Please reduce the length of "
                              "the input messages.",
                              ctx, n));
  if (r.max_tokens) {
    p.max_tokens = *r.max_tokens;
    if (n + p.max_tokens > ctx)
      bad("max_tokens", fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                                    "tokens ({} in the messages, {} in the completion). Please reduce the length "
                                    "of the messages or completion.",
                                    ctx, n + p.max_tokens, n, p.max_tokens));
  } else {
    p.max_tokens = r.endpoint == Endpoint::Chat ? ctx - n : std::min(d.completions_max_tokens, ctx - n);
  }
  return p;
}
}  // namespace

PromptResult build_prompt(const ApiRequest& r, const Tokenizer& tok, int64_t ctx, const RequestDefaults& d) {
  return guarded<PromptResult>([&](PromptResult& out) {
    out.prompt = make_prompt(r, PromptInput{r.prompt_text, r.prompt_tokens}, tok, ctx, d);
  });
}

PromptsResult build_prompts(const ApiRequest& r, const Tokenizer& tok, int64_t ctx, const RequestDefaults& d) {
  return guarded<PromptsResult>([&](PromptsResult& out) {
    for (const auto& [id, bias] : r.sampling.logit_bias)
      if (id >= tok.vocab_size())
        bad("logit_bias", fmt::format("'logit_bias' token id {} is outside the vocabulary of {}", id, tok.vocab_size()));
    if (r.endpoint == Endpoint::Chat || r.prompts.empty()) {
      out.prompts.push_back(make_prompt(r, PromptInput{r.prompt_text, r.prompt_tokens}, tok, ctx, d));
      return;
    }
    for (const PromptInput& in : r.prompts) out.prompts.push_back(make_prompt(r, in, tok, ctx, d));
  });
}

TokenizeParse parse_tokenize(std::string_view body) {
  return guarded<TokenizeParse>([&](TokenizeParse& out) {
    Json j = parse_object(body);
    TokenizeRequest r;
    for (const char* k : {"prompt", "content"})
      if (has(j, k)) r.text = string(j, k);
    if (has(j, "messages")) {
      // Exactly the chat endpoint's parse (tools, tool_choice, response_format,
      // chat_template_kwargs, reasoning_effort), so the count is the chat prompt's.
      ApiRequest chat;
      chat.endpoint = Endpoint::Chat;
      parse_chat(j, chat);
      r.chat = std::move(chat);
    }
    if (!r.text && !r.chat) bad("prompt", "'prompt' (or 'messages') is required");
    if (has(j, "add_special_tokens")) r.add_special = boolean(j, "add_special_tokens");
    out.request = std::move(r);
  });
}

DetokenizeParse parse_detokenize(std::string_view body, int64_t vocab) {
  return guarded<DetokenizeParse>([&](DetokenizeParse& out) {
    Json j = parse_object(body);
    if (!has(j, "tokens") || !j["tokens"].is_array()) bad("tokens", "'tokens' must be an array of token ids");
    for (const Json& t : j["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
        bad("tokens", fmt::format("every token must be an integer id in [0, {})", vocab));
      out.tokens.push_back(int32_t(t.get<int64_t>()));
    }
  });
}

std::string error_json(const ApiError& e) {
  Json j = {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? Json() : Json(e.param)},
              {"code", e.status}}}};
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace cm::serve
