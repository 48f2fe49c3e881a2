// A fake libnvidia-ml.so.1 for tests: the real dlopen/NVML code of devices/inventory.cpp
// runs against scripted GPUs. The script is the file named by $FAKE_NVML_CONFIG, re-read at
// every nvmlInit_v2 (the inventory initialises NVML per snapshot), so a test changes the
// GPUs' state between checks by rewriting it. One item per line, '#' starts a comment:
//
//   init_error 999                       nvmlInit_v2 fails with this code
//   count_error 9                        nvmlDeviceGetCount_v2 fails with this code
//   gpu name="Fake A100" uuid=GPU-0a pci=00000000:01:00.0 total_mb=40960 used_mb=1024
//       util=10 procs=1234:1024,self:512 memory_error=999
//
// (a gpu is one line; `self` in procs is the calling process's pid).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "devices/nvml_api.h"

namespace {

struct FakeGpu {
  std::string name = "Fake GPU", uuid, pci;
  unsigned long long total = 0, used = 0;
  unsigned util = 0;
  std::vector<std::pair<unsigned, unsigned long long>> procs;
  int memory_error = 0;
};

struct Script {
  int init_error = 0, count_error = 0;
  std::vector<FakeGpu> gpus;
};

std::mutex g_mutex;
Script g_script;
int g_init_count = 0;

std::vector<std::string> tokens(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
    } else if ((c == ' ' || c == '\t') && !quoted) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

Script load() {
  Script s;
  const char* path = std::getenv("FAKE_NVML_CONFIG");
  if (!path) return s;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    const auto t = tokens(line);
    if (t.empty()) continue;
    if (t[0] == "init_error" && t.size() > 1) s.init_error = std::atoi(t[1].c_str());
    if (t[0] == "count_error" && t.size() > 1) s.count_error = std::atoi(t[1].c_str());
    if (t[0] != "gpu") continue;
    FakeGpu g;
    g.uuid = "GPU-fake-" + std::to_string(s.gpus.size());
    char pci[32];
    std::snprintf(pci, sizeof pci, "00000000:%02zX:00.0", s.gpus.size() + 1);
    g.pci = pci;
    for (std::size_t i = 1; i < t.size(); ++i) {
      const auto eq = t[i].find('=');
      if (eq == std::string::npos) continue;
      const std::string k = t[i].substr(0, eq), v = t[i].substr(eq + 1);
      if (k == "name")
        g.name = v;
      else if (k == "uuid")
        g.uuid = v;
      else if (k == "pci")
        g.pci = v;
      else if (k == "total_mb")
        g.total = std::strtoull(v.c_str(), nullptr, 10) << 20;
      else if (k == "used_mb")
        g.used = std::strtoull(v.c_str(), nullptr, 10) << 20;
      else if (k == "util")
        g.util = static_cast<unsigned>(std::atoi(v.c_str()));
      else if (k == "memory_error")
        g.memory_error = std::atoi(v.c_str());
      else if (k == "procs") {
        std::stringstream ss(v);
        std::string p;
        while (std::getline(ss, p, ',')) {
          const auto colon = p.find(':');
          const std::string pid = p.substr(0, colon);
          const unsigned long long mb =
              colon == std::string::npos ? 0 : std::strtoull(p.c_str() + colon + 1, nullptr, 10);
          g.procs.emplace_back(
              pid == "self" ? static_cast<unsigned>(getpid()) : static_cast<unsigned>(std::atoi(pid.c_str())),
              mb << 20);
        }
      }
    }
    s.gpus.push_back(g);
  }
  return s;
}

const FakeGpu* gpu(nvmlDevice_t d) {
  const auto i = reinterpret_cast<std::uintptr_t>(d) - 1;
  return i < g_script.gpus.size() ? &g_script.gpus[i] : nullptr;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) nvmlReturn_t nvmlInit_v2() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_script = load();
  if (g_script.init_error) return g_script.init_error;
  ++g_init_count;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlShutdown() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
  --g_init_count;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) const char* nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST:
      return "GPU is lost";
    case NVML_ERROR_UNKNOWN:
      return "Unknown Error";
    default:
      return "Fake NVML error";
  }
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (g_script.count_error) return g_script.count_error;
  *count = static_cast<unsigned>(g_script.gpus.size());
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t* d) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (i >= g_script.gpus.size()) return NVML_ERROR_INVALID_ARGUMENT;
  *d = reinterpret_cast<nvmlDevice_t>(static_cast<std::uintptr_t>(i) + 1);
  return NVML_SUCCESS;
}

#define FAKE_GPU_OR_RETURN()                              \
  std::lock_guard<std::mutex> lock(g_mutex);              \
  if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED; \
  const FakeGpu* g = gpu(d);                              \
  if (!g) return NVML_ERROR_INVALID_ARGUMENT

static nvmlReturn_t copy_string(const std::string& s, char* buf, unsigned len) {
  if (s.size() + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char* buf, unsigned len) {
  FAKE_GPU_OR_RETURN();
  return copy_string(g->name, buf, len);
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char* buf, unsigned len) {
  FAKE_GPU_OR_RETURN();
  return copy_string(g->uuid, buf, len);
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t* pci) {
  FAKE_GPU_OR_RETURN();
  std::memset(pci, 0, sizeof *pci);
  std::snprintf(pci->busId, sizeof pci->busId, "%s", g->pci.c_str());
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
  FAKE_GPU_OR_RETURN();
  if (g->memory_error) return g->memory_error;
  m->total = g->total;
  m->used = g->used;
  m->free = g->total - g->used;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d,
                                                                                  nvmlUtilization_t* u) {
  FAKE_GPU_OR_RETURN();
  u->gpu = g->util;
  u->memory = 0;
  return NVML_SUCCESS;
}

__attribute__((visibility("default"))) nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d,
                                                                                            unsigned int* count,
                                                                                            nvmlProcessInfo_t* infos) {
  FAKE_GPU_OR_RETURN();
  if (*count < g->procs.size()) {
    *count = static_cast<unsigned>(g->procs.size());
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  *count = static_cast<unsigned>(g->procs.size());
  for (std::size_t i = 0; i < g->procs.size(); ++i) infos[i] = {g->procs[i].first, g->procs[i].second, 0, 0};
  return NVML_SUCCESS;
}

}  // extern "C"
