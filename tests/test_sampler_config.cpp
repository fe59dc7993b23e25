// generation_config.json defaults and stop strings (the pieces `generate` needs around the sampler).
#include <gtest/gtest.h>

#include "chat/stop_strings.h"
#include "common/error.h"
#include "sampling/generation_config.h"

using namespace cm;

TEST(GenerationConfig, ReadsHfFields) {
  auto g = parse_generation_config(R"({"bos_token_id": 0, "eos_token_id": [1, 128804], "do_sample": true,
                                       "temperature": 0.6, "top_p": 0.95, "top_k": 40, "max_new_tokens": 512,
                                       "transformers_version": "4.46"})");
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(g.sampling.top_p, 0.95f);
  EXPECT_EQ(g.sampling.top_k, 40);
  EXPECT_EQ(g.eos_ids, (std::vector<int32_t>{1, 128804}));
  EXPECT_EQ(g.max_new_tokens, 512);
  auto single = parse_generation_config(R"({"eos_token_id": 1, "temperature": 0.7})");
  EXPECT_EQ(single.eos_ids, std::vector<int32_t>{1});
  EXPECT_EQ(single.sampling.temperature, 0.0f);  // do_sample absent -> greedy (HF semantics)
  EXPECT_EQ(parse_generation_config(R"({"do_sample": true})").sampling.temperature, 1.0f);
  auto none = load_generation_config("/nonexistent_cm_dir");
  EXPECT_EQ(none.sampling.temperature, 0.0f);
  EXPECT_TRUE(none.eos_ids.empty());
}

TEST(GenerationConfig, RejectsBadValues) {
  EXPECT_THROW(parse_generation_config("{"), Error);
  EXPECT_THROW(parse_generation_config(R"({"do_sample": true, "temperature": -1})"), Error);
  EXPECT_THROW(parse_generation_config(R"({"top_p": 0})"), Error);
  EXPECT_THROW(parse_generation_config(R"({"top_k": "many"})"), Error);
  EXPECT_THROW(parse_generation_config(R"({"eos_token_id": ["x"]})"), Error);
}

// Ids outside int32, wrong types and deep nesting are named errors (ids were truncated silently).
TEST(GenerationConfig, IdsTypesAndNestingAreChecked) {
  auto err = [](const std::string& text) {
    try {
      parse_generation_config(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err(R"({"eos_token_id": 4294967297})").find("4294967297 is not a token id"), std::string::npos);
  EXPECT_NE(err(R"({"eos_token_id": [1, -2]})").find("-2 is not a token id"), std::string::npos);
  EXPECT_EQ(err(R"({"do_sample": "true"})"), "generation_config.json: key 'do_sample': expected a boolean, got a string");
  EXPECT_EQ(err(R"({"top_p": "0.9"})"), "generation_config.json: key 'top_p': expected a number, got a string");
  EXPECT_NE(err(R"({"top_k": 1e300})").find("key 'top_k'"), std::string::npos);
  EXPECT_NE(err("{\"x\":" + std::string(100000, '[') + std::string(100000, ']') + "}").find("nested deeper than 64"),
            std::string::npos);
}

TEST(StopStrings, ReleasesSafeTextAndStopsAtTheEarliestMatch) {
  chat::StopStrings s({"###", "\nUser:"});
  std::string out;
  for (const char* p : {"Hello #", "# world", "\nUs", "er: next"}) {
    auto r = s.push(p);
    out += r.text;
    if (r.stopped) break;
  }
  out += s.flush();
  EXPECT_EQ(out, "Hello ## world");
  EXPECT_TRUE(s.stopped());

  chat::StopStrings t({"##x"});
  EXPECT_EQ(t.push("a#").text, "a");    // "#" might start the stop string
  EXPECT_EQ(t.push("#").text, "");      // "##" still might
  EXPECT_EQ(t.push("y").text, "##y");   // it did not
  EXPECT_EQ(t.push("##").text, "");
  EXPECT_EQ(t.flush(), "##");           // end of generation releases the tail
  chat::StopStrings none({});
  EXPECT_EQ(none.push("abc").text, "abc");
}
