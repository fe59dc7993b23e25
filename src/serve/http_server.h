// The HTTP front of `clawmine serve` (cpp-httplib): routes, auth, body limit, SSE streaming and
// draining. Handlers only parse and validate (serve/request.h), submit a Job to the Engine and
// relay its events (serve/openai.h); they never touch model state. Endpoints:
//   GET /health  GET /version  GET /v1/models  GET /v1/models/{id}  GET /metrics
//   POST /v1/completions  POST /v1/chat/completions  POST /v1/responses (serve/responses.h)
//   POST /tokenize  POST /detokenize
//   OPTIONS * (CORS preflight; answered without auth, as browsers send it without credentials)
// With an API key, /v1/*, /tokenize and /detokenize need "Authorization: Bearer KEY".
// With --allowed-origins, responses to a listed Origin carry CORS headers (none by default).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/engine.h"
#include "serve/metrics.h"
#include "serve/request.h"

namespace cm {
class Tokenizer;
}

namespace cm::serve {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;             // "" = no auth
  std::string model_name;          // served model name
  size_t max_body_bytes = 4u << 20;
  int http_threads = 256;          // concurrent connections served (each stream holds one)
  int64_t ctx = 4096;
  int64_t vocab = 0;               // the model's vocabulary (prompt ids must be below it)
  std::string allowed_origins;     // --allowed-origins: "" = no CORS, "*", or a comma list
  bool strict_requests = false;    // --strict-requests: unknown request fields are a 400
  std::string version, commit;     // what GET /version answers (the binary's build)
  // Structured output (response_format, guided_*, tool_choice required/named); null: a request
  // asking for it gets a 400.
  std::shared_ptr<GrammarCompiler> grammar;
};

class HttpServer {
 public:
  HttpServer(runtime::Engine& engine, const Tokenizer& tok, Metrics& metrics, RequestDefaults defaults, HttpOptions opt);
  ~HttpServer();
  // Binds; cm::Error naming host:port when it cannot. Returns the bound port (port 0 = any).
  int bind();
  // Serves until stop(); blocking.
  void serve();
  // Draining: new generation requests get 503, /health too; busy() while any is in flight.
  void refuse_new();
  bool busy() const;
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cm::serve
