#pragma once
// Strings in a byte trie, for the added tokens a tokenizer splits a text at. Internal to text/.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace trainer::text::detail {

/// Strings in a byte trie: all of them that start at a position, found in one walk.
class ByteTrie {
 public:
  /// Adds `s` (non-empty) as item `index`; a string added twice keeps its first index.
  void add(const std::string& s, std::int32_t index) {
    std::int32_t node = 0;
    for (const char c : s) {
      const auto key = edge(node, c);
      const auto it = edges_.find(key);
      if (it != edges_.end()) {
        node = it->second;
      } else {
        items_.push_back(-1);
        node = static_cast<std::int32_t>(items_.size() - 1);
        edges_.emplace(key, node);
      }
    }
    if (items_[static_cast<std::size_t>(node)] < 0) items_[static_cast<std::size_t>(node)] = index;
  }
  /// Calls f(index, length) for each string that starts at `at` in `s`, shortest first.
  template <class F>
  void matches(std::string_view s, std::size_t at, F&& f) const {
    std::int32_t node = 0;
    for (std::size_t i = at; i < s.size(); ++i) {
      const auto it = edges_.find(edge(node, s[i]));
      if (it == edges_.end()) return;
      node = it->second;
      if (items_[static_cast<std::size_t>(node)] >= 0) f(items_[static_cast<std::size_t>(node)], i + 1 - at);
    }
  }
  bool empty() const { return items_.size() == 1; }

 private:
  static std::uint64_t edge(std::int32_t node, char c) {
    return (static_cast<std::uint64_t>(node) << 8) | static_cast<unsigned char>(c);
  }
  std::unordered_map<std::uint64_t, std::int32_t> edges_;
  std::vector<std::int32_t> items_{-1};  ///< per node: the item ending there, or -1
};

}  // namespace trainer::text::detail
