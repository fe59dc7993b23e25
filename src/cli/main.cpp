// clawmine: DeepSeek-V4 inference engine, command-line front end.
// Every error that reaches here becomes one line on stderr and exit code 1.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "common/error.h"

namespace cm::cli {
std::vector<Command>& command_table() {
  static std::vector<Command> table;
  return table;
}
}  // namespace cm::cli

int main(int argc, char** argv) {
  CLI::App app{"clawmine: DeepSeek-V4 inference engine"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "clawmine 0.1");
  std::vector<std::pair<CLI::App*, cm::cli::CommandRun>> runs;
  try {
    for (auto& c : cm::cli::command_table()) {
      CLI::App* sub = app.add_subcommand(c.name, c.help);
      runs.emplace_back(sub, c.setup(*sub));
    }
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      int rc = app.exit(e);
      return rc == 0 ? 0 : 1;
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
