#include "common/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "common/error.h"

namespace cm {

void setup_logging(const LogOptions& o) {
  const spdlog::level::level_enum level = spdlog::level::from_str(o.level);
  // from_str answers "off" for any name it does not know; only "off" itself may mean that.
  CM_CHECK(o.level == "off" || level != spdlog::level::off,
           "--log-level: unknown level '{}' (debug, info, warn, error or off)", o.level);
  std::vector<spdlog::sink_ptr> sinks{std::make_shared<spdlog::sinks::stderr_sink_mt>()};
  if (!o.file.empty()) {
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(o.file, /*truncate=*/false));
    } catch (const spdlog::spdlog_ex& e) {
      fail("--log-file {}: {}", o.file, e.what());
    }
  }
  auto logger = std::make_shared<spdlog::logger>("clawmine", sinks.begin(), sinks.end());
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  logger->set_level(level);
  logger->flush_on(spdlog::level::info);  // a line is on disk when the request it describes is answered
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace cm
