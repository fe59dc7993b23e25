// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it (", " and ": "
// separators, Python float repr, Python's escape set). DeepSeek-V4's prompt format embeds tool
// schemas and tool-call arguments serialised this way, so the bytes must match the reference
// encoder (encoding_dsv4.py) for the prompt to tokenize identically.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace cm::chat {

// json.dumps(value, ensure_ascii=False). Key order is the ordered_json insertion order, which is
// the order Python's json.loads keeps.
std::string py_json_dumps(const nlohmann::ordered_json& value);
// json.dumps(str) for one string (quotes included).
std::string py_json_string(std::string_view s);
// repr(float) as Python prints it ("2.5", "1e-07", "1e+16", "100.0").
std::string py_float_repr(double v);

}  // namespace cm::chat
