// clawmine: DeepSeek-V4 inference engine, command-line front end.
// Every error that reaches here becomes one line on stderr and exit code 1
// (an unknown command or flags: one line per problem, each with the nearest
// valid name when one is close). `clawmine help [CMD]` prints the help;
// `--version` answers before anything else is touched (no model, no CUDA).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include <fmt/format.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/threads.h"
#include "cli/version.h"
#include "common/error.h"

namespace cm::cli {
std::vector<Command>& command_table() {
  static std::vector<Command> table;
  return table;
}
}  // namespace cm::cli

namespace {

std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names{"help"};
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(s->get_name());
  return names;
}

CLI::App* find_command(CLI::App& app, const std::string& name) {
  for (CLI::App* s : app.get_subcommands([](CLI::App*) { return true; }))
    if (s->get_name() == name) return s;
  return nullptr;
}

int unknown_command(const CLI::App& app, const std::string& name) {
  std::string near = cm::cli::nearest(name, command_names(app));
  std::fprintf(stderr, "error: unknown command '%s'%s; `clawmine help` lists the commands\n", name.c_str(),
               near.empty() ? "" : (" (did you mean '" + near + "'?)").c_str());
  return 1;
}

bool looks_like_number(const char* s) {
  char* end = nullptr;
  std::strtod(s, &end);
  return end && end != s && *end == '\0';
}

// Every flag of argv[first..] that `sub` does not know, one line each with the
// nearest known flag. CLI11 alone stops at the first and names no alternative.
int unknown_flags(CLI::App& sub, int argc, char** argv, int first) {
  std::vector<std::string> known;
  for (const CLI::Option* o : sub.get_options()) {
    for (const std::string& s : o->get_snames()) known.push_back("-" + s);
    for (const std::string& l : o->get_lnames()) known.push_back("--" + l);
  }
  int bad = 0;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-' || looks_like_number(a.c_str())) continue;
    std::string name = a.substr(0, a.find('='));
    const CLI::Option* opt = nullptr;
    if (name.rfind("--", 0) == 0) opt = sub.get_option_no_throw(name);
    else opt = sub.get_option_no_throw(name.substr(0, 2));  // -t4 is -t 4
    if (opt) {
      // The next word is this option's value (it may start with '-', as in -p "-x" or -s -1).
      if (opt->get_type_size() != 0 && a.find('=') == std::string::npos && !(name.size() > 2 && name[1] != '-'))
        ++i;
      continue;
    }
    std::string near = cm::cli::nearest(name, known);
    std::fprintf(stderr, "error: %s: unknown flag '%s'%s\n", sub.get_name().c_str(), name.c_str(),
                 near.empty() ? "" : (" (did you mean '" + near + "'?)").c_str());
    ++bad;
  }
  if (bad) std::fprintf(stderr, "`clawmine help %s` lists its flags\n", sub.get_name().c_str());
  return bad ? 1 : 0;
}

// CLI11's help with our usage line: "Usage: clawmine CMD [OPTIONS]" (CLI11 prints the binary's
// full path and its own word order).
std::string help_text(const CLI::App& app, const std::string& usage) {
  std::string h = app.help();
  const size_t at = h.find("Usage:");
  if (at == std::string::npos) return h;
  const size_t end = h.find('\n', at);
  return h.replace(at, end == std::string::npos ? std::string::npos : end - at, "Usage: " + usage);
}

// The option of `sub` a CLI11 message names ("--n-predict", "-n"), or null.
const CLI::Option* option_named(const CLI::App& sub, const std::string& name) {
  for (const CLI::Option* o : sub.get_options())
    if (o->check_name(name) || o->get_name() == name) return o;
  return nullptr;
}

// A CLI11 parse error in the project's words, with the program and command named:
//   clawmine generate: --n-predict: "abc" is not an integer
// CLI11 2.1 says "Could not convert: --n-predict = abc" or "--n-predict: Value abc not in range ...".
std::string parse_error_text(const CLI::App& app, const CLI::ParseError& e) {
  std::string where = "clawmine";
  const CLI::App* sub = nullptr;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
    if (s->parsed()) sub = s, where += " " + s->get_name();
  std::string msg = e.what();
  const std::string conv = "Could not convert: ";
  if (msg.rfind(conv, 0) == 0) {
    const size_t eq = msg.find(" = ", conv.size());
    const std::string name = msg.substr(conv.size(), eq - conv.size());
    const std::string value = eq == std::string::npos ? "" : msg.substr(eq + 3);
    std::string kind = "a valid value";
    if (const CLI::Option* o = sub ? option_named(*sub, name) : nullptr) {
      const std::string t = o->get_type_name();
      if (t.find("INT") != std::string::npos || t == "UINT") kind = "an integer";
      else if (t.find("FLOAT") != std::string::npos) kind = "a number";
    }
    return fmt::format("{}: {}: \"{}\" is not {}", where, name, value, kind);
  }
  if (msg.rfind("A subcommand is required", 0) == 0) return where + ": no command given; `clawmine help` lists them";
  return where + ": " + msg;
}

// Flags before the command (clawmine --versoin): only --version/-v and --help/-h exist there.
int unknown_top_flags(int argc, char** argv, int at) {
  int bad = 0;
  for (int i = 1; i < at && i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--version" || a == "-v" || a == "--help" || a == "-h") continue;
    const std::string name = a.substr(0, a.find('='));
    const std::string near = cm::cli::nearest(name, {"--version", "--help"});
    std::fprintf(stderr, "clawmine: unknown flag '%s'%s\n", name.c_str(),
                 near.empty() ? "" : (" (did you mean '" + near + "'?)").c_str());
    ++bad;
  }
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "-v"))) {
    std::fputs(cm::cli::version_text().c_str(), stdout);
    return 0;
  }
  cm::cli::ensure_passive_wait(argv);
  CLI::App app{"clawmine: DeepSeek-V4 inference engine"};
  app.require_subcommand(1);
  app.set_version_flag("-v,--version", cm::cli::version_text());
  app.footer("`clawmine help CMD` shows the flags of one command.");
  std::vector<std::pair<CLI::App*, cm::cli::CommandRun>> runs;
  try {
    for (auto& c : cm::cli::command_table()) {
      CLI::App* sub = app.add_subcommand(c.name, c.help);
      runs.emplace_back(sub, c.setup(*sub));
    }
    // The first word that is not a flag names the command.
    int at = 1;
    while (at < argc && argv[at][0] == '-') ++at;
    if (argc == 1) {  // no command: the list of commands, as llama.cpp's tools print their usage
      std::fputs(help_text(app, "clawmine CMD [OPTIONS]").c_str(), stderr);
      return 1;
    }
    if (int rc = unknown_top_flags(argc, argv, at)) return rc;
    if (at < argc) {
      const std::string name = argv[at];
      if (name == "help") {
        if (at + 1 >= argc) {
          std::fputs(help_text(app, "clawmine CMD [OPTIONS]").c_str(), stdout);
          return 0;
        }
        CLI::App* sub = find_command(app, argv[at + 1]);
        if (!sub) return unknown_command(app, argv[at + 1]);
        std::fputs(help_text(*sub, "clawmine " + sub->get_name() + " [OPTIONS]").c_str(), stdout);
        return 0;
      }
      CLI::App* sub = find_command(app, name);
      if (!sub) return unknown_command(app, name);
      if (int rc = unknown_flags(*sub, argc, argv, at + 1)) return rc;
    }
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      const CLI::App* sub = nullptr;
      for (auto& [s, run] : runs)
        if (s->parsed()) sub = s;
      std::fputs((sub ? help_text(*sub, "clawmine " + sub->get_name() + " [OPTIONS]")
                      : help_text(app, "clawmine CMD [OPTIONS]")).c_str(), stdout);
      return 0;
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);  // --version
      std::fprintf(stderr, "%s\n", parse_error_text(app, e).c_str());
      return 1;
    }
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
    return 1;
  } catch (const cm::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
