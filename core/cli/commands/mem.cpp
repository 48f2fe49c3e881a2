// `trainer mem`: every GPU the device inventory sees (NVML: per process too) and the host's
// memory with this process's.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>

#include "command.h"
#include "trainer/devices.h"
#include "trainer/error.h"
#include "trainer/memory.h"

namespace trainer::cli {

namespace {

void print_json(const HostMemory& h, const InventorySnapshot& inv) {
  using nlohmann::ordered_json;
  ordered_json devices = ordered_json::array();
  for (const auto& g : inv.gpus) {
    ordered_json processes = ordered_json::array();
    for (const auto& p : g.processes) processes.push_back({{"pid", p.pid}, {"used_bytes", p.used_bytes}});
    devices.push_back({{"device", g.id},
                       {"name", g.name},
                       {"uuid", g.uuid},
                       {"pci_bus_id", g.pci_bus_id},
                       {"physical_index", g.physical_index},
                       {"total_bytes", g.total},
                       {"free_bytes", g.free},
                       {"used_bytes", g.used},
                       {"utilization_percent", g.utilization},
                       {"error", g.error},
                       {"processes", processes}});
  }
  devices.push_back({{"device", "cpu"},
                     {"total_bytes", h.total},
                     {"free_bytes", h.available},
                     {"used_bytes", h.total - h.available},
                     {"process_rss_bytes", h.process_rss},
                     {"process_peak_rss_bytes", h.process_peak_rss}});
  const ordered_json out = {{"source", inv.source}, {"notes", inv.notes}, {"devices", devices}};
  std::cout << out.dump(-1, ' ', false, ordered_json::error_handler_t::replace) << "\n";
}

void print_table(const HostMemory& h, const InventorySnapshot& inv) {
  auto col = [](std::int64_t b) {
    std::string s = b < 0 ? "unknown" : format_bytes(b);
    return s + std::string(s.size() < 12 ? 12 - s.size() : 1, ' ');
  };
  std::cout << "device  total       free        used        details\n";
  for (const auto& g : inv.gpus) {
    std::string id = g.id;
    id.resize(std::max<std::size_t>(id.size() + 1, 8), ' ');
    std::cout << id << col(g.total) << col(g.free) << col(g.used) << g.name;
    if (g.utilization >= 0) std::cout << ", utilisation " << g.utilization << " %";
    if (!g.error.empty()) std::cout << ", error: " << g.error;
    std::cout << "\n";
    for (const auto& p : g.processes) {
      std::cout << "          pid " << p.pid << ": " << (p.used_bytes < 0 ? "unknown" : format_bytes(p.used_bytes))
                << "\n";
    }
  }
  std::cout << "cpu     " << col(h.total) << col(h.available) << col(h.total - h.available)
            << "this process: " << format_bytes(h.process_rss) << " rss, " << format_bytes(h.process_peak_rss)
            << " peak\n";
  std::cout << "GPUs via " << inv.source;
  for (const auto& n : inv.notes) std::cout << "; " << n;
  std::cout << "\n";
}

}  // namespace

Command mem_command() {
  Command c;
  c.name = "mem";
  c.synopsis = "trainer mem [--json]";
  c.summary = "total / free / used memory per device, and this process's";
  c.options = [](po::options_description& d) { d.add_options()("json", "print JSON"); };
  c.run = [](const Invocation& in) -> int {
    TRAINER_CHECK_T(UsageError, in.args.empty(), "unexpected argument '", in.args.empty() ? "" : in.args.front(), "'");
    const HostMemory h = host_memory();
    const InventorySnapshot inv = device_inventory()->snapshot();
    if (in.vm.count("json")) {
      print_json(h, inv);
    } else {
      print_table(h, inv);
    }
    return kExitOk;
  };
  return c;
}

}  // namespace trainer::cli
