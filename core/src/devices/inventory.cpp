#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "devices/nvml_api.h"
#include "memory/backend.h"
#include "trainer/devices.h"
#include "trainer/error.h"
#include "trainer/memory.h"

namespace trainer {

DeviceInventory::~DeviceInventory() = default;

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

/// NVML opened once per process with dlopen; the handle stays for the process's life.
class Nvml {
 public:
  static Nvml& instance() {
    static Nvml n;
    return n;
  }
  bool loaded() const { return handle_ != nullptr; }
  const std::string& load_error() const { return load_error_; }
  const std::string& path() const { return path_; }

  std::string error(nvmlReturn_t r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return std::string(s ? s : "NVML error") + " (" + std::to_string(r) + ")";
  }

  nvmlInit_v2_fn init = nullptr;
  nvmlShutdown_fn shutdown = nullptr;
  nvmlErrorString_fn error_string = nullptr;
  nvmlDeviceGetCount_v2_fn count = nullptr;
  nvmlDeviceGetHandleByIndex_v2_fn handle_by_index = nullptr;
  nvmlDeviceGetName_fn name = nullptr;
  nvmlDeviceGetUUID_fn uuid = nullptr;
  nvmlDeviceGetPciInfo_v3_fn pci = nullptr;
  nvmlDeviceGetMemoryInfo_fn memory = nullptr;
  nvmlDeviceGetUtilizationRates_fn utilization = nullptr;
  nvmlDeviceGetComputeRunningProcesses_fn processes = nullptr;

 private:
  Nvml() {
    path_ = env("TRAINER_NVML_LIBRARY").value_or("libnvidia-ml.so.1");
    void* h = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      load_error_ = "cannot load " + path_ + ": " + (e ? e : "unknown dlopen error");
      return;
    }
    std::string missing;
    auto sym = [&](auto& fn, const char* symbol, bool required) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, symbol));
      if (!fn && required) missing += std::string(missing.empty() ? "" : ", ") + symbol;
    };
    sym(init, "nvmlInit_v2", true);
    sym(shutdown, "nvmlShutdown", true);
    sym(error_string, "nvmlErrorString", false);
    sym(count, "nvmlDeviceGetCount_v2", true);
    sym(handle_by_index, "nvmlDeviceGetHandleByIndex_v2", true);
    sym(name, "nvmlDeviceGetName", true);
    sym(uuid, "nvmlDeviceGetUUID", true);
    sym(pci, "nvmlDeviceGetPciInfo_v3", false);
    sym(memory, "nvmlDeviceGetMemoryInfo", true);
    sym(utilization, "nvmlDeviceGetUtilizationRates", false);
    sym(processes, "nvmlDeviceGetComputeRunningProcesses_v3", false);
    if (!processes) sym(processes, "nvmlDeviceGetComputeRunningProcesses_v2", false);
    if (!missing.empty()) {
      load_error_ = path_ + " lacks " + missing + " (driver too old?)";
      dlclose(h);
      return;
    }
    handle_ = h;
  }
  void* handle_ = nullptr;
  std::string path_, load_error_;
};

/// Reads every GPU of the host through NVML, in NVML (PCI bus) order. Returns false with
/// `why` when NVML cannot be used at all; per-device query failures are notes.
bool nvml_gpus(std::vector<DeviceInfo>& out, std::vector<std::string>& notes, std::string& why) {
  Nvml& nv = Nvml::instance();
  if (!nv.loaded()) {
    why = nv.load_error();
    return false;
  }
  nvmlReturn_t r = nv.init();
  if (r != NVML_SUCCESS) {
    why = "nvmlInit failed: " + nv.error(r);
    return false;
  }
  struct Shutdown {
    Nvml& nv;
    ~Shutdown() { nv.shutdown(); }
  } shutdown{nv};
  unsigned count = 0;
  r = nv.count(&count);
  if (r != NVML_SUCCESS) {
    why = "nvmlDeviceGetCount failed: " + nv.error(r);
    return false;
  }
  for (unsigned i = 0; i < count; ++i) {
    DeviceInfo d;
    d.physical_index = static_cast<int>(i);
    nvmlDevice_t h = nullptr;
    r = nv.handle_by_index(i, &h);
    if (r != NVML_SUCCESS) {
      // Keep the slot (indices must stay aligned with the driver's) but mark it unusable.
      d.error = nv.error(r);
      notes.push_back("GPU " + std::to_string(i) + ": " + d.error);
      out.push_back(std::move(d));
      continue;
    }
    char buf[kNvmlUuidBufferSize > kNvmlNameBufferSize ? kNvmlUuidBufferSize : kNvmlNameBufferSize] = {};
    if (nv.name(h, buf, kNvmlNameBufferSize) == NVML_SUCCESS) d.name = buf;
    buf[0] = '\0';
    if (nv.uuid(h, buf, kNvmlUuidBufferSize) == NVML_SUCCESS) d.uuid = buf;
    nvmlPciInfo_t pci{};
    if (nv.pci && nv.pci(h, &pci) == NVML_SUCCESS) d.pci_bus_id = pci.busId;
    nvmlMemory_t mem{};
    r = nv.memory(h, &mem);
    if (r == NVML_SUCCESS) {
      d.total = static_cast<std::int64_t>(mem.total);
      d.free = static_cast<std::int64_t>(mem.free);
      d.used = static_cast<std::int64_t>(mem.used);
    } else {
      d.error = "memory: " + nv.error(r);
      notes.push_back("GPU " + std::to_string(i) + " " + d.error);
    }
    nvmlUtilization_t util{};
    if (nv.utilization && nv.utilization(h, &util) == NVML_SUCCESS) d.utilization = static_cast<int>(util.gpu);
    if (nv.processes) {
      nvmlProcessInfo_t procs[128];
      unsigned n = 128;
      r = nv.processes(h, &n, procs);
      if (r == NVML_SUCCESS) {
        for (unsigned p = 0; p < n && p < 128; ++p) {
          d.processes.push_back(
              {static_cast<std::int64_t>(procs[p].pid), procs[p].usedGpuMemory == kNvmlValueNotAvailable
                                                            ? -1
                                                            : static_cast<std::int64_t>(procs[p].usedGpuMemory)});
        }
      } else if (r != NVML_ERROR_NOT_SUPPORTED) {
        notes.push_back("GPU " + std::to_string(i) + " processes: " + nv.error(r));
      }
    }
    out.push_back(std::move(d));
  }
  return true;
}

DeviceInfo cpu_info() {
  const HostMemory h = host_memory();
  DeviceInfo d;
  d.id = "cpu";
  d.name = "host CPU";
  d.total = h.total;
  d.free = h.available;
  d.used = h.total - h.available;
  return d;
}

class SystemInventory final : public DeviceInventory {
 public:
  InventorySnapshot snapshot() override {
    InventorySnapshot s;
    s.cpu = cpu_info();
    std::vector<DeviceInfo> all;
    std::string why;
    if (nvml_gpus(all, s.notes, why)) {
      s.source = "nvml";
    } else {
      s.notes.push_back("NVML: " + why);
#ifdef TRAINER_WITH_CUDA
      std::string cuda_why;
      all = detail::cuda_gpus(&cuda_why);  // already in LibTorch's order and filtered by the runtime
      s.source = all.empty() ? "none" : "cuda";
      if (all.empty()) s.notes.push_back("CUDA runtime: " + cuda_why);
      for (auto& d : all) d.id = "cuda:" + std::to_string(d.index);
      s.gpus = std::move(all);
      return s;
#else
      s.source = "none";
      s.notes.push_back("CUDA runtime: this LibTorch has no CUDA");
      return s;
#endif
    }
    std::vector<std::string> uuids;
    for (const auto& d : all) uuids.push_back(d.uuid);
    std::string warning;
    const std::vector<int> visible = visible_gpus(env("CUDA_VISIBLE_DEVICES"), uuids, &warning);
    if (!warning.empty()) s.notes.push_back(warning);
    for (std::size_t i = 0; i < visible.size(); ++i) {
      DeviceInfo d = all[static_cast<std::size_t>(visible[i])];
      d.index = static_cast<int>(i);
      d.id = "cuda:" + std::to_string(i);
      s.gpus.push_back(std::move(d));
    }
    return s;
  }
};

std::mutex g_mutex;
std::shared_ptr<DeviceInventory> g_override;

}  // namespace

std::shared_ptr<DeviceInventory> system_inventory() {
  static auto inv = std::make_shared<SystemInventory>();
  return inv;
}

std::shared_ptr<DeviceInventory> device_inventory() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_override ? g_override : system_inventory();
}

void set_device_inventory(std::shared_ptr<DeviceInventory> inventory) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_override = std::move(inventory);
}

std::string prefer_pci_bus_order() {
  const auto order = env("CUDA_DEVICE_ORDER");
  if (!order) {
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);
    return "";
  }
  if (*order == "PCI_BUS_ID") return "";
  return "CUDA_DEVICE_ORDER=" + *order +
         ": CUDA numbers GPUs differently from the driver (PCI bus order); device indices in logs and "
         "leases may not match LibTorch's. Unset it or set PCI_BUS_ID";
}

std::vector<int> visible_gpus(const std::optional<std::string>& value, const std::vector<std::string>& uuids,
                              std::string* warning) {
  std::vector<int> out;
  const int n = static_cast<int>(uuids.size());
  if (!value) {
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  std::string rest = *value;
  std::size_t pos = 0;
  while (pos <= rest.size()) {
    const std::size_t comma = rest.find(',', pos);
    const std::string entry = trim(rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    pos = comma == std::string::npos ? rest.size() + 1 : comma + 1;
    if (entry.empty() && out.empty() && comma == std::string::npos) break;  // "" exposes nothing
    int found = -1;
    std::string problem;
    if (!entry.empty() && std::all_of(entry.begin(), entry.end(), ::isdigit)) {
      const long v = entry.size() > 6 ? -1 : std::stol(entry);
      if (v >= 0 && v < n)
        found = static_cast<int>(v);
      else
        problem = "no GPU " + entry + " (the host has " + std::to_string(n) + ")";
    } else if (entry.rfind("GPU-", 0) == 0) {
      int matches = 0;
      for (int i = 0; i < n; ++i) {
        if (uuids[static_cast<std::size_t>(i)].rfind(entry, 0) == 0) {
          found = i;
          ++matches;
        }
      }
      if (matches != 1) {
        problem = matches == 0 ? "no GPU has UUID " + entry : "UUID prefix " + entry + " is ambiguous";
        found = -1;
      }
    } else {
      problem = entry == "-1" ? "" : "'" + entry + "' is neither an index nor a GPU UUID";
    }
    if (found >= 0 && std::find(out.begin(), out.end(), found) != out.end()) {
      problem = "GPU " + entry + " listed twice";
      found = -1;
    }
    if (found < 0) {
      // The CUDA runtime stops at the first entry it cannot use.
      if (warning && !problem.empty()) {
        *warning = "CUDA_VISIBLE_DEVICES=" + *value + ": " + problem + "; it and the entries after it are ignored";
      }
      break;
    }
    out.push_back(found);
  }
  return out;
}

}  // namespace trainer
