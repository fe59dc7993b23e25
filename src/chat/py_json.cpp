// Python-compatible JSON serialisation; see py_json.h.
#include "chat/py_json.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace cm::chat {

std::string py_json_string(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
  return out;
}

// Python's float repr: the shortest round-trip digits, fixed notation when the decimal exponent
// is in [-4, 16), scientific ("1e-07", "1.5e+300") otherwise; fixed always shows a fraction.
std::string py_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02"
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  int exp10 = std::atoi(sci.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out = neg ? "-" : "";
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 < 0) {
      out += "0." + std::string(-exp10 - 1, '0') + digits;
    } else if (static_cast<size_t>(exp10) + 1 >= digits.size()) {
      out += digits + std::string(exp10 + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exp10 + 1) + "." + digits.substr(exp10 + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out.append(digits, 1, std::string::npos);
  }
  out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out;
}

std::string py_json_dumps(const nlohmann::ordered_json& v) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::null: return "null";
    case T::boolean: return v.get<bool>() ? "true" : "false";
    case T::number_integer: return std::to_string(v.get<int64_t>());
    case T::number_unsigned: return std::to_string(v.get<uint64_t>());
    case T::number_float: return py_float_repr(v.get<double>());
    case T::string: return py_json_string(v.get_ref<const std::string&>());
    case T::array: {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        out += py_json_dumps(v[i]);
      }
      return out + "]";
    }
    case T::object: {
      std::string out = "{";
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        out += py_json_string(it.key());
        out += ": ";
        out += py_json_dumps(it.value());
        first = false;
      }
      return out + "}";
    }
    default: return "null";  // binary/discarded values never come from parsed JSON
  }
}

}  // namespace cm::chat
