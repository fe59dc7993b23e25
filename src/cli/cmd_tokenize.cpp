// `clawmine tokenize` and `clawmine detokenize`: text <-> token ids with a model's tokenizer.json,
// for checking prompts and for the differential test against HF `tokenizers`
// (tests/tokenizer_diff.py uses --batch-hex). --model may be a directory holding only the
// tokenizer files; without it the embedded default model's tokenizer is used.
#include <chrono>
#include <ctime>
#include <cstdio>
#include <memory>
#include <sstream>

#include <unistd.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/engine_options.h"
#include "common/error.h"
#include "io/input_file.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string read_all(const std::string& path, const char* flag) {
  return cm::read_regular_file(path, cm::kMaxTextBytes, flag);
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

std::string unhex_line(const std::string& h, size_t line) {
  CM_CHECK(h.size() % 2 == 0, "tokenize: --batch-hex line {} has an odd number of hex digits", line);
  std::string out;
  for (size_t i = 0; i < h.size(); i += 2) {
    auto nib = [&](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      cm::fail("tokenize: --batch-hex line {} has a non-hex character", line);
    };
    out += static_cast<char>(nib(h[i]) * 16 + nib(h[i + 1]));
  }
  return out;
}

// "1,2,3" or "1 2 3" -> ids
std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&]() {
    if (cur.empty()) return;
    size_t pos = 0;
    long long v = 0;
    try {
      v = std::stoll(cur, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    CM_CHECK(pos == cur.size() && v >= 0 && v <= INT32_MAX, "detokenize: '{}' is not a token id", cur);
    ids.push_back(static_cast<int32_t>(v));
    cur.clear();
  };
  for (char c : s) {
    if (c == ',' || c == ' ' || c == '\n' || c == '\t') flush();
    else cur += c;
  }
  flush();
  return ids;
}

struct TokenizeOptions {
  std::string model, prompt, file, batch_hex;
  CLI::Option* model_flag = nullptr;
  bool no_special = false, add_special = false, time = false;
};

cm::cli::CommandRegistrar reg_tokenize({"tokenize", "Print the token ids of a text", [](CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  cm::cli::add_model_option(app, o->model, &o->model_flag);
  auto* p = app.add_option("-p,--prompt", o->prompt, "Text to tokenize");
  auto* f = app.add_option("-f,--file", o->file, "File whose exact bytes are tokenized (- = stdin; with no -p/-f, "
                                                 "a text piped into stdin is read)");
  auto* b = app.add_option("--batch-hex", o->batch_hex,
                           "File with one hex-encoded input per line; prints one line of ids each");
  p->excludes(f)->excludes(b);
  f->excludes(b);
  app.add_flag("--no-special", o->no_special, "Encode special-token text as ordinary text");
  app.add_flag("--add-special", o->add_special, "Add BOS/EOS as tokenizer_config.json asks");
  app.add_flag("--time", o->time, "Print encode speed (MB/s) on stderr");
  return [o, p, f, b]() -> int {
    CM_CHECK(p->count() + f->count() + b->count() <= 1, "tokenize: give one of -p TEXT, --file F, --batch-hex F");
    // As generate: -f - reads stdin, and with no input flag a text piped into stdin is read.
    if (p->count() + f->count() + b->count() == 0 && ::isatty(STDIN_FILENO))
      cm::fail("tokenize: no text: give -p TEXT, -f FILE (- for stdin) or --batch-hex FILE, or pipe the text into stdin");
    cm::Tokenizer tok = cm::Tokenizer::load(cm::cli::resolve_model(o->model, o->model_flag));
    cm::EncodeOptions eo{.parse_special = !o->no_special, .add_special = o->add_special};
    if (b->count()) {
      std::istringstream in(read_all(o->batch_hex, "--batch-hex"));
      std::string line, out;
      for (size_t n = 1; std::getline(in, line); ++n) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        out += join_ids(tok.encode(unhex_line(line, n), eo));
        out += '\n';
      }
      std::fwrite(out.data(), 1, out.size(), stdout);
      return 0;
    }
    // A path must be a regular file (a FIFO or device would block or never end); "-" is stdin.
    std::string text = f->count() ? (o->file == "-" ? cm::cli::read_text_file("-", "-f/--file")
                                                    : read_all(o->file, "--file"))
                       : p->count() ? o->prompt
                                    : cm::cli::read_text_file("-", "stdin");
    // No flag and nothing piped (stdin empty or /dev/null) is a missing input, not an empty text.
    CM_CHECK(!text.empty() || p->count() || f->count(),
             "tokenize: no text: give -p TEXT, -f FILE (- for stdin) or --batch-hex FILE, or pipe the text into stdin");
    auto t0 = std::chrono::steady_clock::now();
    std::clock_t c0 = std::clock();
    auto ids = tok.encode(text, eo);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    std::string out = join_ids(ids) + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    if (o->time)
      std::fprintf(stderr, "encoded %zu bytes into %zu tokens in %.3f s (%.1f MB/s; CPU time %.3f s, %.1f MB/s)\n",
                   text.size(), ids.size(), s, s > 0 ? text.size() / 1e6 / s : 0.0, cpu,
                   cpu > 0 ? text.size() / 1e6 / cpu : 0.0);
    return 0;
  };
}});

struct DetokenizeOptions {
  std::string model, ids;
  CLI::Option* model_flag = nullptr;
  bool skip_special = false;
};

cm::cli::CommandRegistrar reg_detokenize({"detokenize", "Print the text of token ids (exact bytes, no newline added)",
                                          [](CLI::App& app) {
  auto o = std::make_shared<DetokenizeOptions>();
  cm::cli::add_model_option(app, o->model, &o->model_flag);
  app.add_option("--ids", o->ids, "Token ids, e.g. 1,2,3 or \"1 2 3\"")->required();
  app.add_flag("--skip-special", o->skip_special, "Leave special tokens out");
  return [o]() -> int {
    cm::Tokenizer tok = cm::Tokenizer::load(cm::cli::resolve_model(o->model, o->model_flag));
    std::string text = tok.decode(parse_ids(o->ids), o->skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  };
}});

}  // namespace
