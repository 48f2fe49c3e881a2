#pragma once
// Private: writes Python pickles (protocol 2) of plain data — dicts, lists, tuples, strings,
// integers, floats, booleans and None — for files Python reads with pickle.load (the memory
// snapshot in PyTorch's format). Values are appended in order: a container's items go between
// its begin and end, a dict's as key, value, key, value. The opcodes are the ones Python's own
// pickler writes for such data and that PyTorch's memory viewer (MemoryViz.js) reads: a dict's
// items as one MARK … SETITEMS, a list's item by item (APPEND: a viewer pushing a batch of
// 200,000 at once would overflow its stack).
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace trainer::detail {

class PickleWriter {
 public:
  PickleWriter();

  PickleWriter& begin_dict();
  PickleWriter& end_dict();
  PickleWriter& begin_list();
  PickleWriter& end_list();
  /// A tuple of the values written until end_tuple().
  PickleWriter& begin_tuple();
  PickleWriter& end_tuple();

  /// Any integer (an unsigned one above INT64_MAX is refused).
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  PickleWriter& value(T v) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(std::int64_t)) {
      check_fits(static_cast<std::uint64_t>(v));
    }
    return integer(static_cast<std::int64_t>(v));
  }
  /// UTF-8 text (Python reads it as str).
  PickleWriter& value(std::string_view s);
  PickleWriter& value(const char* s) { return value(std::string_view(s)); }
  PickleWriter& value(double v);
  PickleWriter& value(bool v);
  PickleWriter& none();

  /// key, then `v`: one item of the dict being written.
  template <typename T>
  PickleWriter& item(std::string_view key, T v) {
    value(key);
    return value(v);
  }

  /// The pickle; every container must be ended.
  const std::string& finish();

 private:
  enum class Open : std::uint8_t { Dict, List, Tuple };
  PickleWriter& integer(std::int64_t v);
  static void check_fits(std::uint64_t v);
  /// After a value: counted in its container, and a list's appended.
  void added();

  std::string out_;
  std::vector<Open> open_;
  std::vector<std::int64_t> count_;  ///< values written into each open container
  bool finished_ = false;
};

}  // namespace trainer::detail
