// Force-included into mlx-c's C++ build. mlx-c's private/io.h calls std::format, which GCC 12's
// libstdc++ lacks. Where the standard library has it, this header adds nothing; otherwise it
// supplies a minimal std::format for the plain "{}" placeholders mlx-c's error messages use.
#pragma once
#include <version>
#if !defined(__cpp_lib_format)
#include <sstream>
#include <string>
#include <string_view>

namespace std {
namespace mlx_sys_format_detail {
inline void write(ostringstream& out, string_view fmt) { out << fmt; }

template <typename T, typename... Rest>
void write(ostringstream& out, string_view fmt, const T& value, const Rest&... rest) {
  const auto at = fmt.find("{}");
  if (at == string_view::npos) {
    out << fmt;
    return;
  }
  out << fmt.substr(0, at) << value;
  write(out, fmt.substr(at + 2), rest...);
}
}  // namespace mlx_sys_format_detail

template <typename... Args>
string format(string_view fmt, const Args&... args) {
  ostringstream out;
  mlx_sys_format_detail::write(out, fmt, args...);
  return out.str();
}
}  // namespace std
#endif  // !__cpp_lib_format
