#pragma once
// The report's memory map (private to `trainer report`): the live memory by category over the
// steps, from RUN_DIR/memory.jsonl, and the out-of-memory snapshots' largest allocations, from
// RUN_DIR/memory/oom-*.json (the core writes both with memory.categories on, on the CPU).

#include <filesystem>
#include <string>

#include "report.h"

namespace trainer::report {

/// Reads memory.1.jsonl then memory.jsonl (each up to kMaxTimelineBytes; lines that are not
/// JSON objects are counted and skipped) and the last kMaxSnapshots of memory/oom-*.json by
/// name (neither the directory nor a file is followed through a link) into `data`.
void read_memory_map(const std::filesystem::path& root, RunData& data);

/// The section "Memory by category": a stacked chart of each step's highest point by category
/// (MiB), with the out-of-memory errors and micro-batch changes marked, then a table per
/// snapshot. "" when the run directory has neither.
std::string memory_map_section(const RunData& data);

}  // namespace trainer::report
