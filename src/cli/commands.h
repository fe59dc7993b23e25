// Subcommand registry of the `clawmine` binary. Each cmd_*.cpp file defines
// one subcommand and registers it with a static CommandRegistrar, so adding a
// command never touches main.cpp. A command's setup function declares its
// flags on the CLI11 subcommand and returns the function to run.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace cm::cli {

using CommandRun = std::function<int()>;
struct Command {
  std::string name;
  std::string help;
  std::function<CommandRun(CLI::App&)> setup;
};

std::vector<Command>& command_table();

struct CommandRegistrar {
  explicit CommandRegistrar(Command c) { command_table().push_back(std::move(c)); }
};

}  // namespace cm::cli
