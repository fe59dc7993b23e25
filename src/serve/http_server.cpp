// HTTP routes of the server (see http_server.h). Each generation request: parse + validate
// (pure functions), tokenize, submit its Jobs (one per choice: serve/choices.h), then relay their events — as SSE chunks from a
// chunked content provider (a failed write or an early release marks the Job cancelled, so the
// engine frees its slot at the next step) or as one JSON body.
#include "serve/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fmt/ranges.h>
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>

#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "chat/dsv4.h"
#include "common/error.h"
#include "serve/choices.h"
#include "serve/http_policy.h"
#include "serve/openai.h"
#include "serve/responses.h"
#include "serve/structured.h"
#include "tokenizer/tokenizer.h"

namespace cm::serve {

using Json = nlohmann::ordered_json;

namespace {
void reply_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_json(e), "application/json");
}
void reply_json(httplib::Response& res, const Json& j) {
  res.status = 200;
  res.set_content(j.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}
// The connected socket of a request: cpp-httplib 0.11 does not expose it, so look for the
// descriptor whose peer and local ports are the request's (once per non-streamed request). -1 if
// not found. It stays this connection's until the handler returns.
int find_socket(const httplib::Request& req) {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2) continue;
    sockaddr_storage peer{}, self{};
    socklen_t pl = sizeof(peer), sl = sizeof(self);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sl) != 0) continue;
    auto port_of = [](const sockaddr_storage& a) {
      if (a.ss_family == AF_INET) return int(ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port));
      if (a.ss_family == AF_INET6) return int(ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port));
      return -1;
    };
    if (port_of(peer) == req.remote_port && port_of(self) == req.local_port) {
      found = fd;
      break;
    }
  }
  ::closedir(d);
  return found;
}

// True when the client has closed its end (an orderly close reads as 0 bytes; a pipelined next
// request is data and keeps the connection alive).
bool peer_closed(int fd) {
  if (fd < 0) return false;
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}
constexpr size_t kMaxHeaderBytes = 64 * 1024;
const char* reason_phrase(int status) {
  switch (status) {
    case 404: return "not found";
    case 405: return "method not allowed";
    case 413: return "request body too large (see --max-body-bytes)";
    case 414: return "request URI too long";
    case 431: return "request header fields too large (at most 64 KiB in all)";
    default: return "request failed";
  }
}
}  // namespace

struct HttpServer::Impl {
  runtime::Engine& engine;
  const Tokenizer& tok;
  Metrics& metrics;
  RequestDefaults defaults;
  HttpOptions opt;
  httplib::Server svr;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> inflight{0};
  int listen_fd = -1;
  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};
  std::vector<std::string> origins;  // parsed --allowed-origins (empty: no CORS)

  Impl(runtime::Engine& e, const Tokenizer& t, Metrics& m, RequestDefaults d, HttpOptions o)
      : engine(e), tok(t), metrics(m), defaults(std::move(d)), opt(std::move(o)),
        origins(parse_allowed_origins(opt.allowed_origins)) {}

  uint64_t random64() {
    std::lock_guard<std::mutex> l(rng_mu);
    return rng();
  }

  bool authorized(const httplib::Request& req) const {
    if (opt.api_key.empty()) return true;
    const std::string h = req.get_header_value("Authorization");
    const std::string want = "Bearer " + opt.api_key;
    if (h.size() != want.size()) return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < h.size(); ++i) diff |= (unsigned char)(h[i] ^ want[i]);
    return diff == 0;
  }

  Json model_card() const {
    return {{"id", opt.model_name},  {"object", "model"},        {"created", unix_now()},
            {"owned_by", "clawmine"}, {"max_model_len", opt.ctx}};
  }

  void routes();
  void generate(const httplib::Request& req, const std::string& body, httplib::Response& res, Endpoint ep);
  void responses(const httplib::Request& req, const std::string& body, httplib::Response& res);
  // A request's jobs (one per choice) and the prompt texts `echo` leads them with.
  struct Submitted {
    std::vector<std::shared_ptr<Job>> jobs;
    std::vector<std::string> echo;
  };
  // Checks a parsed request against the server (unknown fields, model, context, vocabulary) and
  // submits its jobs; nullopt once `fail_with` has answered a refused request.
  std::optional<Submitted> submit(ApiRequest& r, const std::string& id,
                                  const std::function<void(const ApiError&)>& fail_with);
  // Relays one submitted job's events to the client through responder R (ResponsesResponder, built
  // over the request Q it keeps): SSE when `stream`, else one body. Chat and completions, whose
  // requests may hold several choices, go through ChoiceSet in generate().
  template <typename Q, typename R>
  void relay_one(const httplib::Request& req, httplib::Response& res, Q q, bool stream, std::shared_ptr<Job> job,
                 ResponseMeta meta, std::chrono::steady_clock::time_point arrived);
  void tokenize(const std::string& body, httplib::Response& res);
  void detokenize(const std::string& body, httplib::Response& res);
  // A POST route that reads its body itself (see read_body) and hands it to `fn`.
  void post(const char* path, std::function<void(const httplib::Request&, const std::string&, httplib::Response&)> fn);
};

namespace {
// The body of a JSON endpoint, read here rather than by cpp-httplib: the library parses an
// application/x-www-form-urlencoded body into form fields and refuses one over 8 KiB with a
// 413 (a limit compiled into Debian's shared library), which is what `curl -d @prompt.json`
// sends. Through a content reader the only limit is --max-body-bytes. False (the response set)
// when the body is too large or not of a JSON type (check_body_type).
bool read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
               std::string* body) {
  const std::string ct = req.get_header_value("Content-Type");
  if (req.is_multipart_form_data()) {
    // Not read at all (the reader would need a multipart callback); the connection closes so the
    // unread bytes are never taken for the next request.
    res.set_header("Connection", "close");
    reply_error(res, *check_body_type(ct, ""));
    return false;
  }
  if (!reader([&](const char* data, size_t n) {
        body->append(data, n);
        return true;
      }))
    return false;  // cpp-httplib set the status (413 beyond --max-body-bytes, 400 when cut short)
  if (auto e = check_body_type(ct, *body)) {
    reply_error(res, *e);
    return false;
  }
  return true;
}
}  // namespace

void HttpServer::Impl::post(
    const char* path, std::function<void(const httplib::Request&, const std::string&, httplib::Response&)> fn) {
  svr.Post(path, [fn](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    std::string body;
    if (read_body(req, res, reader, &body)) fn(req, body, res);
  });
}

// The access line of a request that reached the engine: one at info when it ends (TTFT counts
// from the request's arrival to its first token event, queueing and prefill included).
template <typename R>
void log_access(const std::string& id, int status, const R& r, double ttft_s) {
  spdlog::info("{}: {} prompt={} output={} ttft={} finish={}", id, status, r.prompt_tokens(), r.completion_tokens(),
               ttft_s < 0 ? std::string("-") : fmt::format("{:.3f}s", ttft_s),
               r.failed() ? "error: " + r.error() : r.done() ? r.finish_reason() : std::string("client left"));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What a streaming response needs across provider calls (owned by the provider and releaser).
struct StreamState {
  ApiRequest req;
  ChoiceSet choices;
  bool started = false;
  std::chrono::steady_clock::time_point arrived, last_write = std::chrono::steady_clock::now();
  StreamState(ApiRequest r, ResponseMeta m, const Tokenizer& tok, std::vector<std::shared_ptr<Job>> jobs,
              const std::vector<std::string>& echo)
      : req(std::move(r)), choices(req, std::move(m), tok, std::move(jobs), echo) {}
};

// The same for a one-job response (/v1/responses).
template <typename Q, typename R>
struct OneStreamState {
  Q req;
  R responder;
  std::shared_ptr<Job> job;
  bool started = false;
  std::chrono::steady_clock::time_point arrived, last_write = std::chrono::steady_clock::now();
  double ttft = -1;
  OneStreamState(Q r, ResponseMeta m, const Tokenizer& tok, std::shared_ptr<Job> j)
      : req(std::move(r)), responder(req, std::move(m), tok), job(std::move(j)) {}
};

void HttpServer::Impl::generate(const httplib::Request& req, const std::string& body, httplib::Response& res,
                                Endpoint ep) {
  const bool chat = ep == Endpoint::Chat;
  const auto arrived = std::chrono::steady_clock::now();
  const std::string id = fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl", random64());
  auto fail_with = [&](const ApiError& e) {
    spdlog::info("{}: {} {}", id, e.status, e.message);
    reply_error(res, e);
  };
  if (draining) return fail_with({503, "server_error", "the server is shutting down", ""});
  ParseResult pr = parse_request(body, ep, defaults);
  if (pr.error) return fail_with(*pr.error);
  ApiRequest& r = *pr.request;
  auto sub = submit(r, id, fail_with);
  if (!sub) return;
  std::vector<std::shared_ptr<Job>>& jobs = sub->jobs;
  const std::vector<std::string>& echo = sub->echo;
  ResponseMeta meta{id, unix_now(), opt.model_name};
  if (!r.stream) {
    ChoiceSet cs(r, meta, tok, std::move(jobs), echo);
    const int sock = find_socket(req);
    while (!cs.done()) {
      cs.consume(200);
      if (!cs.done() && peer_closed(sock)) cs.cancel();  // the client left: free the slots
    }
    --inflight;
    log_access(id, cs.failed() ? 500 : 200, cs, cs.ttft(arrived));
    if (cs.failed()) return reply_error(res, {500, "server_error", cs.error(), ""});
    res.status = 200;
    res.set_content(cs.body(), "application/json");
    return;
  }
  auto st = std::make_shared<StreamState>(std::move(r), meta, tok, std::move(jobs), echo);
  st->arrived = arrived;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        std::string out;
        if (!st->started) {
          out = st->choices.stream_start();
          st->started = true;
        }
        out += st->choices.stream(out.empty() ? 200 : 0);
        const auto now = std::chrono::steady_clock::now();
        // An SSE comment now and then lets a write notice a client that left while queued.
        if (out.empty() && now - st->last_write > std::chrono::milliseconds(500)) out = ": keep-alive\n\n";
        if (!out.empty()) {
          st->last_write = now;
          if (!sink.write(out.data(), out.size())) {
            st->choices.cancel();
            return false;
          }
        }
        if (st->choices.done()) sink.done();
        return true;
      },
      [st, this](bool) {
        if (!st->choices.done()) st->choices.cancel();
        --inflight;
        // A stream's status is 200 once headers went out; a client that left shows as "cancelled".
        log_access(st->choices.id(), 200, st->choices, st->choices.ttft(st->arrived));
      });
}

void HttpServer::Impl::responses(const httplib::Request& req, const std::string& body, httplib::Response& res) {
  const auto arrived = std::chrono::steady_clock::now();
  const std::string id = fmt::format("resp_{:016x}", random64());
  auto fail_with = [&](const ApiError& e) {
    spdlog::info("{}: {} {}", id, e.status, e.message);
    reply_error(res, e);
  };
  if (draining) return fail_with({503, "server_error", "the server is shutting down", ""});
  ResponsesParse pr = parse_responses_request(body, defaults);
  if (pr.error) return fail_with(*pr.error);
  // The shared checks word their errors for chat ("messages", "max_tokens"): say them our way.
  auto sub = submit(pr.request->chat, id, [&](const ApiError& e) { fail_with(responses_error(e)); });
  if (!sub) return;
  const bool stream = pr.request->chat.stream;
  relay_one<ResponsesRequest, ResponsesResponder>(req, res, std::move(*pr.request), stream, std::move(sub->jobs[0]),
                                                  {id, unix_now(), opt.model_name}, arrived);
}

std::optional<HttpServer::Impl::Submitted> HttpServer::Impl::submit(
    ApiRequest& r, const std::string& id, const std::function<void(const ApiError&)>& fail_with) {
  const auto fail_with_none = [&](const ApiError& e) -> std::optional<Submitted> {
    fail_with(e);
    return std::nullopt;
  };
  if (!r.unknown_fields.empty()) {
    const std::string names = fmt::format("'{}'", fmt::join(r.unknown_fields, "', '"));
    if (opt.strict_requests)
      return fail_with_none({400, "invalid_request_error",
                        fmt::format("unknown request field(s) {} (the server runs with --strict-requests)", names),
                        r.unknown_fields[0]});
    spdlog::warn("{}: the request has fields this server ignores: {}", id, names);
  }
  if (!r.model.empty() && r.model != opt.model_name)
    return fail_with_none({404, "NotFoundError", fmt::format("The model '{}' does not exist (this server serves '{}')",
                                                         r.model, opt.model_name), "model"});
  PromptsResult pp = build_prompts(r, tok, opt.ctx, defaults);
  if (pp.error) return fail_with_none(*pp.error);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> budgets;
  std::vector<std::string> echo;
  for (Prompt& p : pp.prompts) {
    for (int32_t t : p.tokens)
      if (opt.vocab > 0 && t >= opt.vocab)
        return fail_with_none({400, "invalid_request_error",
                          fmt::format("token id {} is outside the model's vocabulary of {}", t, opt.vocab), "prompt"});
    // echo returns the prompt as text: a token prompt's text is its decoding.
    if (r.echo) {
      const PromptInput& in = r.prompts[prompts.size()];
      echo.push_back(in.text ? *in.text : utf8_sanitize(tok.decode(p.tokens)));
    }
    prompts.push_back(std::move(p.tokens));
    budgets.push_back(p.max_tokens);
  }
  for (const auto& [t, bias] : r.sampling.logit_bias)
    if (opt.vocab > 0 && t >= opt.vocab)
      return fail_with_none({400, "invalid_request_error",
                        fmt::format("'logit_bias' token id {} is outside the model's vocabulary of {}", t, opt.vocab),
                        "logit_bias"});

  // Compiled here, so a schema XGrammar refuses is a 400 before anything runs.
  ConstraintResult constraint = request_constraint(r, opt.grammar, tok);
  if (constraint.error) return fail_with_none(*constraint.error);

  JobSpec spec;
  spec.id = id;
  spec.constraint = std::move(constraint.constraint);
  spec.sampling = r.sampling;
  spec.stop = r.stop;
  spec.ignore_eos = r.ignore_eos;
  spec.stop_token_ids = r.stop_token_ids;
  spec.min_tokens = r.min_tokens;
  spec.logprobs = r.logprobs;
  std::vector<std::shared_ptr<Job>> jobs = make_jobs(r, spec, prompts, budgets, [this] { return random64(); });

  ++inflight;
  engine.submit(jobs);
  return Submitted{std::move(jobs), std::move(echo)};
}

template <typename Q, typename R>
void HttpServer::Impl::relay_one(const httplib::Request& req, httplib::Response& res, Q q, bool stream,
                             std::shared_ptr<Job> job, ResponseMeta meta, std::chrono::steady_clock::time_point arrived) {
  const std::string& id = meta.id;
  if (!stream) {
    R resp(q, meta, tok);
    const int sock = find_socket(req);
    double ttft = -1;
    while (!resp.done()) {
      for (const JobEvent& e : job->pop(200)) {
        if (ttft < 0 && e.kind == JobEvent::Token) ttft = seconds_since(arrived);
        resp.consume(e);
      }
      if (!job->cancelled && peer_closed(sock)) job->cancelled = true;  // the client left: free the slot
    }
    --inflight;
    log_access(id, resp.failed() ? 500 : 200, resp, ttft);
    if (resp.failed()) return reply_error(res, {500, "server_error", resp.error(), ""});
    res.status = 200;
    res.set_content(resp.body(), "application/json");
    return;
  }
  auto st = std::make_shared<OneStreamState<Q, R>>(std::move(q), meta, tok, job);
  st->arrived = arrived;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        std::string out;
        if (!st->started) {
          out = st->responder.stream_start();
          st->started = true;
        }
        for (const JobEvent& e : st->job->pop(out.empty() ? 200 : 0)) {
          if (st->ttft < 0 && e.kind == JobEvent::Token) st->ttft = seconds_since(st->arrived);
          out += st->responder.stream(e);
        }
        const auto now = std::chrono::steady_clock::now();
        // An SSE comment now and then lets a write notice a client that left while queued.
        if (out.empty() && now - st->last_write > std::chrono::milliseconds(500)) out = ": keep-alive\n\n";
        if (!out.empty()) {
          st->last_write = now;
          if (!sink.write(out.data(), out.size())) {
            st->job->cancelled = true;
            return false;
          }
        }
        if (st->responder.done()) sink.done();
        return true;
      },
      [st, this](bool) {
        if (!st->responder.done()) st->job->cancelled = true;
        --inflight;
        // A stream's status is 200 once headers went out; a client that left shows as "cancelled".
        log_access(st->job->spec.id, 200, st->responder, st->ttft);
      });
}

void HttpServer::Impl::tokenize(const std::string& body, httplib::Response& res) {
  TokenizeParse p = parse_tokenize(body);
  if (p.error) return reply_error(res, *p.error);
  std::vector<int32_t> ids;
  try {
    EncodeOptions eo;
    eo.add_special = p.request->add_special;
    if (p.request->text) ids = tok.encode(*p.request->text, eo);
    else ids = tok.encode(render_chat(*p.request->chat), eo);
  } catch (const std::exception& e) {
    return reply_error(res, {400, "invalid_request_error", e.what(), "messages"});
  }
  reply_json(res, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", opt.ctx}});
}

void HttpServer::Impl::detokenize(const std::string& body, httplib::Response& res) {
  DetokenizeParse p = parse_detokenize(body, tok.vocab_size());
  if (p.error) return reply_error(res, *p.error);
  reply_json(res, {{"prompt", utf8_sanitize(tok.decode(p.tokens))}});
}

void HttpServer::Impl::routes() {
  svr.set_payload_max_length(opt.max_body_bytes);
  // cpp-httplib listens with a backlog of 5 (a compile-time constant of Debian's library): keep
  // the listening socket so bind() can raise it, else a burst of clients sees refused connections.
  svr.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    if (listen_fd < 0) listen_fd = sock;
  });
  svr.set_keep_alive_timeout(2);
  const int n_threads = opt.http_threads;
  svr.new_task_queue = [n_threads] { return new httplib::ThreadPool(size_t(n_threads)); };
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // cpp-httplib caps each header line (8 KiB) but not their number; refuse what no client needs.
    size_t header_bytes = 0;
    for (const auto& [k, v] : req.headers) header_bytes += k.size() + v.size() + 4;
    if (header_bytes > kMaxHeaderBytes) {
      reply_error(res, {431, "invalid_request_error", reason_phrase(431), ""});
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.method == "OPTIONS") return httplib::Server::HandlerResponse::Unhandled;  // preflight: no credentials
    const bool guarded = req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
    if (!guarded || authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
    reply_error(res, {401, "authentication_error", "missing or wrong API key (send Authorization: Bearer KEY)", ""});
    return httplib::Server::HandlerResponse::Handled;
  });
  // CORS on every response, errors and streams included (this runs before headers are written).
  svr.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const std::string allow = cors_allow_origin(origins, req.get_header_value("Origin"));
    if (allow.empty()) return;
    res.set_header("Access-Control-Allow-Origin", allow);
    if (allow != "*") res.set_header("Vary", "Origin");
  });
  svr.Options(".*", [this](const httplib::Request& req, httplib::Response& res) {
    res.status = 204;
    res.set_header("Allow", "GET, POST, OPTIONS");
    if (cors_allow_origin(origins, req.get_header_value("Origin")).empty()) return;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const std::string asked = req.get_header_value("Access-Control-Request-Headers");
    res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
    res.set_header("Access-Control-Max-Age", "600");
  });
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string type = res.status == 404 ? "NotFoundError" : "invalid_request_error";
    res.set_content(error_json({res.status, type, reason_phrase(res.status), ""}), "application/json");
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    reply_error(res, {500, "server_error", what, ""});
  });

  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining) return reply_error(res, {503, "server_error", "the server is shutting down", ""});
    reply_json(res, {{"status", "ok"}});
  });
  svr.Get("/version", [this](const httplib::Request&, httplib::Response& res) {
    reply_json(res, {{"version", opt.version}, {"commit", opt.commit}});
  });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    reply_json(res, {{"object", "list"}, {"data", Json::array({model_card()})}});
  });
  // Served names may hold '/' (org/model), so the id is the whole rest of the path.
  svr.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id != opt.model_name)
      return reply_error(res, {404, "NotFoundError",
                               fmt::format("The model '{}' does not exist (this server serves '{}')", id,
                                           opt.model_name),
                               "model"});
    reply_json(res, model_card());
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  post("/v1/completions", [this](const httplib::Request& q, const std::string& b, httplib::Response& s) {
    generate(q, b, s, Endpoint::Completions);
  });
  post("/v1/chat/completions", [this](const httplib::Request& q, const std::string& b, httplib::Response& s) {
    generate(q, b, s, Endpoint::Chat);
  });
  post("/v1/responses", [this](const httplib::Request& q, const std::string& b, httplib::Response& s) {
    responses(q, b, s);
  });
  post("/tokenize", [this](const httplib::Request&, const std::string& b, httplib::Response& s) { tokenize(b, s); });
  post("/detokenize", [this](const httplib::Request&, const std::string& b, httplib::Response& s) {
    detokenize(b, s);
  });
}

HttpServer::HttpServer(runtime::Engine& engine, const Tokenizer& tok, Metrics& metrics, RequestDefaults defaults, HttpOptions opt)
    : impl_(new Impl(engine, tok, metrics, std::move(defaults), std::move(opt))) {
  impl_->routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  Impl& m = *impl_;
  int port = m.opt.port;
  if (port == 0) {
    port = m.svr.bind_to_any_port(m.opt.host);
    CM_CHECK(port > 0, "serve: cannot listen on {} (any port)", m.opt.host);
  } else {
    CM_CHECK(m.svr.bind_to_port(m.opt.host, port), "serve: cannot listen on {}:{} (in use, or a bad address?)",
             m.opt.host, port);
  }
  if (m.listen_fd >= 0) ::listen(m.listen_fd, SOMAXCONN);  // Linux: a second listen() resizes the backlog
  return port;
}

void HttpServer::serve() { impl_->svr.listen_after_bind(); }

void HttpServer::refuse_new() { impl_->draining = true; }
bool HttpServer::busy() const { return impl_->inflight > 0 || !impl_->engine.idle(); }

void HttpServer::stop() { impl_->svr.stop(); }

}  // namespace cm::serve
