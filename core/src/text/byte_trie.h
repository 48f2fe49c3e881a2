#pragma once
// Strings in a byte trie, for the added tokens a tokenizer splits a text at. Internal to text/.
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace trainer::text::detail {

/// Strings in a byte trie: all of them that start at a position, found in one walk. Once
/// link()ed it is also an Aho-Corasick automaton: step() reads a text a byte at a time and
/// longest() names the longest string that ends where it has read, at most two edge lookups
/// per byte on average whatever the strings.
class ByteTrie {
 public:
  /// Adds `s` (non-empty) as item `index`; a string added twice keeps its first index. Undoes
  /// link().
  void add(const std::string& s, std::int32_t index) {
    std::int32_t node = 0;
    for (const char c : s) {
      const auto key = edge(node, c);
      const auto it = edges_.find(key);
      if (it != edges_.end()) {
        node = it->second;
      } else {
        items_.push_back(-1);
        depth_.push_back(depth_[static_cast<std::size_t>(node)] + 1);
        node = static_cast<std::int32_t>(items_.size() - 1);
        edges_.emplace(key, node);
      }
    }
    if (items_[static_cast<std::size_t>(node)] < 0) items_[static_cast<std::size_t>(node)] = index;
    fail_.clear();
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

  /// Builds the automaton's failure links (each node's longest proper suffix that is a node)
  /// and, per node, the longest string that ends it. Call after the last add(), before step().
  void link() {
    const std::size_t n = items_.size();
    std::vector<std::vector<std::pair<unsigned char, std::int32_t>>> children(n);
    for (const auto& [key, child] : edges_) {
      children[static_cast<std::size_t>(key >> 8)].emplace_back(static_cast<unsigned char>(key & 0xFF), child);
    }
    fail_.assign(n, 0);
    longest_.assign(n, -1);
    std::deque<std::int32_t> order{0};  // breadth first: a node's suffixes are linked before it
    while (!order.empty()) {
      const std::int32_t node = order.front();
      order.pop_front();
      const auto at = static_cast<std::size_t>(node);
      longest_[at] = items_[at] >= 0 ? node : longest_[static_cast<std::size_t>(fail_[at])];
      for (const auto& [c, child] : children[at]) {
        std::size_t ignored = 0;
        fail_[static_cast<std::size_t>(child)] = node == 0 ? 0 : step(fail_[at], static_cast<char>(c), ignored);
        order.push_back(child);
      }
    }
  }
  bool linked() const { return !fail_.empty(); }

  /// The automaton's node after reading `c` at `node`: the longest suffix of what it has read
  /// that is a node. Adds the edge lookups it made to `lookups`. Needs link().
  std::int32_t step(std::int32_t node, char c, std::size_t& lookups) const {
    for (;;) {
      ++lookups;
      const auto it = edges_.find(edge(node, c));
      if (it != edges_.end()) return it->second;
      if (node == 0) return 0;
      node = fail_[static_cast<std::size_t>(node)];
    }
  }
  /// The longest string that is a suffix of `node`'s: {its index, its length}; {-1, 0} when
  /// none is. Needs link().
  std::pair<std::int32_t, std::size_t> longest(std::int32_t node) const {
    const std::int32_t end = longest_[static_cast<std::size_t>(node)];
    if (end < 0) return {-1, 0};
    return {items_[static_cast<std::size_t>(end)], static_cast<std::size_t>(depth_[static_cast<std::size_t>(end)])};
  }

 private:
  static std::uint64_t edge(std::int32_t node, char c) {
    return (static_cast<std::uint64_t>(node) << 8) | static_cast<unsigned char>(c);
  }
  std::unordered_map<std::uint64_t, std::int32_t> edges_;
  std::vector<std::int32_t> items_{-1};  ///< per node: the item ending there, or -1
  std::vector<std::int32_t> depth_{0};   ///< per node: its string's length
  std::vector<std::int32_t> fail_;       ///< per node, once linked: its failure link
  std::vector<std::int32_t> longest_;    ///< per node, once linked: the node of its longest suffix item, or -1
};

}  // namespace trainer::text::detail
