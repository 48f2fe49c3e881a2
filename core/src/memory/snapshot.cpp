#include "trainer/memory_snapshot.h"

#include <fmt/format.h>

#include <algorithm>

#include "memory/backend.h"
#include "trainer/json.h"
#include "trainer/states.h"
#include "util/durable_file.h"

namespace trainer {

namespace detail {

/// The name of a phase code (OomPhase + 1; 0 = none).
std::string phase_of_code(std::uint8_t code) {
  if (code == 0 || code > static_cast<int>(OomPhase::Checkpoint) + 1) return "";
  return oom_phase_name(static_cast<OomPhase>(code - 1));
}

std::vector<MemoryBlockInfo> blocks_of(const std::vector<LiveBlock>& live) {
  std::vector<MemoryBlockInfo> out;
  out.reserve(live.size());
  for (const LiveBlock& b : live) {
    out.push_back({static_cast<std::uint64_t>(b.address), b.size, b.serial, b.category, phase_of_code(b.phase)});
  }
  return out;
}

}  // namespace detail

MemorySnapshot memory_snapshot(const c10::Device& device, const std::string& reason) {
  MemorySnapshot s;
  s.live = memory_breakdown(device);  // throws without categories
  s.device = device.str();
  s.reason = reason;
  s.blocks = detail::blocks_of(detail::cpu_live_blocks(&s.blocks_left_out));
  s.limit = memory_stats(device).limit;
  return s;
}

namespace {

std::string categories_json(const MemoryBreakdown& b) {
  std::string out = "{";
  for (std::size_t i = 0; i < kMemoryCategoryCount; ++i) {
    out += fmt::format("{}\"{}\":{}", i ? "," : "", memory_category_name(static_cast<MemoryCategory>(i)), b.bytes[i]);
  }
  return out + "}";
}

}  // namespace

void write_memory_snapshot(const MemorySnapshot& s, const std::string& path_prefix, std::size_t largest) {
  std::vector<const MemoryBlockInfo*> order;
  order.reserve(s.blocks.size());
  for (const auto& b : s.blocks) order.push_back(&b);
  const std::size_t shown = std::min(largest, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(),
                    [](const MemoryBlockInfo* a, const MemoryBlockInfo* b) {
                      return a->size != b->size ? a->size > b->size : a->serial < b->serial;
                    });
  std::string text = fmt::format(
      "{{\n  \"device\": {},\n  \"reason\": {},\n  \"step\": {},\n  \"epoch\": {},\n  \"phase\": {},\n"
      "  \"micro_batch\": {},\n  \"attempt\": {},\n  \"requested\": {},\n  \"limit\": {},\n  \"allocated\": {},\n"
      "  \"largest_category\": {},\n  \"categories\": {},\n  \"blocks\": {},\n  \"blocks_left_out\": {},\n"
      "  \"largest\": [",
      json_quote(s.device), json_quote(s.reason), s.step, s.epoch, json_quote(s.phase), s.micro_batch, s.attempt,
      s.requested, s.limit, s.live.allocated, json_quote(memory_category_name(s.live.largest())),
      categories_json(s.live), s.blocks.size(), s.blocks_left_out);
  for (std::size_t i = 0; i < shown; ++i) {
    const MemoryBlockInfo& b = *order[i];
    text +=
        fmt::format("{}\n    {{\"size\": {}, \"category\": \"{}\", \"phase\": {}, \"serial\": {}, \"address\": {}}}",
                    i ? "," : "", b.size, memory_category_name(b.category), json_quote(b.phase), b.serial, b.address);
  }
  text += "\n  ]\n}\n";
  detail::write_atomic(path_prefix + ".json", text);
}

}  // namespace trainer
