#include "trainer/memory_snapshot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "memory/backend.h"
#include "trainer/json.h"
#include "trainer/states.h"
#include "util/durable_file.h"
#include "util/pickle_writer.h"

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
  if (!has_memory_categories(device)) memory_breakdown(device);  // throws, saying why there is none
  s.device = device.str();
  s.reason = reason;
  std::vector<detail::LiveBlock> live;
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) {
    s.live = detail::cuda_live(device.has_index() ? device.index() : 0, live, s.blocks_left_out);
    s.blocks = detail::blocks_of(live);
    s.limit = memory_stats(device).limit;
    return s;
  }
#endif
  s.live = detail::cpu_live(live, s.blocks_left_out);  // the categories and the blocks of one instant
  s.blocks = detail::blocks_of(live);
  s.limit = memory_stats(device).limit;
  s.block_overhead = detail::kCpuBlockHeader;
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

/// The frames PyTorch's viewers show for a block, innermost first: its phase, then its category.
void frames_of(detail::PickleWriter& p, const MemoryBlockInfo& b) {
  p.begin_list();
  p.begin_dict().item("filename", "phase").item("line", 0).item("name", b.phase.empty() ? "none" : b.phase).end_dict();
  p.begin_dict().item("filename", "category").item("line", 0).item("name", memory_category_name(b.category)).end_dict();
  p.end_list();
}

/// The blocks the pickle holds: every one, or the kMaxPickledBlocks largest (equal sizes: the
/// oldest), oldest first.
std::vector<const MemoryBlockInfo*> pickled_blocks(const MemorySnapshot& s) {
  std::vector<const MemoryBlockInfo*> out;
  out.reserve(s.blocks.size());
  for (const auto& b : s.blocks) out.push_back(&b);
  if (out.size() > kMaxPickledBlocks) {
    const auto larger = [](const MemoryBlockInfo* a, const MemoryBlockInfo* b) {
      return a->size != b->size ? a->size > b->size : a->serial < b->serial;
    };
    std::nth_element(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(kMaxPickledBlocks), out.end(), larger);
    out.resize(kMaxPickledBlocks);
    std::sort(out.begin(), out.end(),
              [](const MemoryBlockInfo* a, const MemoryBlockInfo* b) { return a->serial < b->serial; });
  }
  return out;
}

/// `s` as torch.cuda.memory._snapshot() gives it (see write_memory_snapshot).
std::string pickle_of(const MemorySnapshot& s) {
  detail::PickleWriter p;
  const std::int64_t overhead = std::max<std::int64_t>(s.block_overhead, 0);
  const std::vector<const MemoryBlockInfo*> blocks = pickled_blocks(s);
  // The device's index ("cuda:1" -> 1); the CPU's is 0.
  const std::size_t colon = s.device.find(':');
  const std::int64_t device = colon == std::string::npos ? 0 : std::atoll(s.device.c_str() + colon + 1);
  p.begin_dict();
  p.value("segments").begin_list();
  for (const MemoryBlockInfo* block : blocks) {
    const MemoryBlockInfo& b = *block;
    const auto address = static_cast<std::int64_t>(b.address);
    p.begin_dict()
        .item("device", device)
        .item("address", address - overhead)
        .item("total_size", b.size + overhead)
        .item("allocated_size", b.size)
        .item("active_size", b.size)
        .item("requested_size", b.size)
        .item("stream", 0)
        .item("segment_type", "large")
        .item("is_expandable", false);
    p.value("segment_pool_id").begin_tuple().value(0).value(0).end_tuple();
    p.value("frames").begin_list().end_list();
    p.value("blocks").begin_list();
    if (overhead > 0) {
      p.begin_dict().item("address", address - overhead).item("size", overhead).item("requested_size", 0);
      p.item("state", "inactive").value("frames").begin_list().end_list().end_dict();
    }
    p.begin_dict().item("address", address).item("size", b.size).item("requested_size", b.size);
    p.item("state", "active_allocated").value("frames");
    frames_of(p, b);
    // Torch 1.13's viewers read the frames from here.
    p.value("history").begin_list().begin_dict().item("addr", address).item("real_size", b.size).value("frames");
    frames_of(p, b);
    p.end_dict().end_list();
    p.end_dict();  // the block
    p.end_list().end_dict();
  }
  p.end_list();
  // One trace per device up to this one (the viewer reads device_traces[device]).
  p.value("device_traces").begin_list();
  for (std::int64_t d = 0; d < device; ++d) p.begin_list().end_list();
  p.begin_list();
  // Some versions of the viewer add the category "unknown" when the trace lacks it, through a
  // misspelt name that throws: a first event of that category keeps them from it.
  p.begin_dict().item("action", "snapshot").item("addr", 0).item("size", 0).item("stream", 0);
  p.item("category", "unknown").value("frames").begin_list().end_list().end_dict();
  for (const MemoryBlockInfo* block : blocks) {
    const MemoryBlockInfo& b = *block;
    p.begin_dict().item("action", "alloc").item("addr", static_cast<std::int64_t>(b.address)).item("size", b.size);
    p.item("stream", 0).item("category", memory_category_name(b.category)).value("frames");
    frames_of(p, b);
    p.end_dict();
  }
  if (s.requested > 0) {
    const std::int64_t free = s.limit > 0 ? std::max<std::int64_t>(s.limit - s.live.allocated, 0) : 0;
    p.begin_dict().item("action", "oom").item("addr", 0).item("size", s.requested).item("stream", 0);
    p.item("device_free", free).value("frames").begin_list().end_list().end_dict();
  }
  p.end_list().end_list();
  p.end_dict();
  return p.finish();
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
  detail::write_atomic(path_prefix + ".pickle", pickle_of(s));
}

}  // namespace trainer
