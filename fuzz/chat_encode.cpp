// Fuzz target: the DeepSeek-V4 chat encoder (messages JSON -> prompt text), as the CLI and the
// server call it. Byte 0 picks the options (mode, drop_thinking, add_bos, reasoning_effort),
// the rest is the messages JSON. Input that is not JSON is skipped (the caller's JSON parser
// reports it); encode_messages itself may only fail with cm::Error. Checks: the prompt starts
// with BOS exactly when add_bos is set.
#include "chat/dsv4.h"
#include "common/error.h"
#include "fuzz_util.h"

using cm::fuzz::fuzz_check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  cm::chat::ChatOptions opt;
  opt.mode = data[0] & 1 ? cm::chat::Mode::Thinking : cm::chat::Mode::Chat;
  opt.drop_thinking = !(data[0] & 2);
  opt.add_bos = !(data[0] & 4);
  static const char* const kEfforts[] = {"", "high", "max", "low"};
  opt.reasoning_effort = kEfforts[(data[0] >> 3) & 3];
  nlohmann::ordered_json messages;
  try {
    messages = nlohmann::ordered_json::parse(cm::fuzz::as_text(data + 1, size - 1));
  } catch (const nlohmann::ordered_json::exception&) {
    return 0;
  }
  try {
    std::string prompt = cm::chat::encode_messages(messages, opt);
    fuzz_check(!opt.add_bos || prompt.rfind(cm::chat::kBos, 0) == 0, "add_bos set but the prompt has no BOS");
  } catch (const cm::Error&) {
  }
  return 0;
}
