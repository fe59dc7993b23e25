// The process's log, set up in one place from LogOptions (fed by --log-level / --log-file):
// spdlog's default logger writes leveled, timestamped lines to stderr and, with a file, to that
// file as well. Code logs with spdlog::info / warn / ... directly; nothing else configures it.
//   [2026-12-05 03:24:01.123] [info] chatcmpl-1f2e...: 200 prompt=12 output=24 ttft=0.210s finish=stop
#pragma once
#include <string>

namespace cm {

struct LogOptions {
  std::string level = "info";  // --log-level: debug | info | warn | error
  std::string file;            // --log-file PATH ("" = stderr only); appended to
};

// Installs the default logger; cm::Error on an unknown level or a file that cannot be opened.
void setup_logging(const LogOptions& o);

}  // namespace cm
