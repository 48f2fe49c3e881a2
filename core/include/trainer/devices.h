#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config_spec.h"
#include "trainer/export.h"

namespace trainer {

/// A device as a setting names it (`runtime.device`, `plugins.device_select.device`,
/// `plugins.oom_backoff.fallback_devices`): `cpu`, `cuda` (= `cuda:0`), `cuda:N` and, where
/// the setting allows it, `auto` (device_select chooses).
struct TRAINER_API DeviceSetting {
  enum class Kind { Auto, Cpu, Cuda };
  Kind kind = Kind::Cpu;
  int index = -1;  ///< the CUDA index (`cuda` = 0); -1 for cpu and auto
  /// LibTorch's name: "cpu", "cuda:N"; "auto" for Auto.
  std::string str() const;
};

/// Parses the device grammar `cpu | cuda | cuda:N` (N: up to 4 digits), and `auto` when
/// `allow_auto`. nullopt for anything else.
TRAINER_API std::optional<DeviceSetting> parse_device_setting(const std::string& text, bool allow_auto = false);

/// The check of a device key, for its KeySpec: `.check(device_setting_check(true))`; its rule
/// reads "cpu, cuda or cuda:N" (with `auto, ` in front when `allow_auto`).
TRAINER_API KeyCheck device_setting_check(bool allow_auto = false);

/// A process using a GPU, as the driver reports it.
struct GpuProcess {
  std::int64_t pid = 0;
  std::int64_t used_bytes = -1;  ///< -1: the driver does not say (containers, MIG)
};

/// One device as the inventory sees it at one moment. Memory in bytes; -1 = unknown.
struct DeviceInfo {
  std::string id;           ///< LibTorch's name for it: "cuda:0" (after CUDA_VISIBLE_DEVICES), "cpu"
  int index = -1;           ///< LibTorch's CUDA index; -1 for the CPU
  int physical_index = -1;  ///< the driver's index (PCI bus order, all GPUs of the host); -1 for the CPU
  std::string name;
  std::string uuid;        ///< "GPU-..." (stable across processes and CUDA_VISIBLE_DEVICES)
  std::string pci_bus_id;  ///< "00000000:3B:00.0"
  std::int64_t total = -1;
  std::int64_t free = -1;
  std::int64_t used = -1;
  int utilization = -1;  ///< GPU busy percent over the driver's last sample period; -1 unknown
  std::vector<GpuProcess> processes;
  std::string error;  ///< why the driver could not report this GPU ("memory: GPU is lost (15)"); empty = fine
  bool is_gpu() const { return index >= 0; }
};

/// What an inventory found: the GPUs this process may use, in LibTorch index order, and the
/// host's CPU memory.
struct InventorySnapshot {
  std::vector<DeviceInfo> gpus;
  DeviceInfo cpu;
  std::string source;              ///< "nvml", "cuda" or "none": where the GPU list came from
  std::vector<std::string> notes;  ///< why a source was not used, visible-devices warnings, ...
};

/// Lists devices. Every call re-queries (free memory changes while a job waits).
class TRAINER_API DeviceInventory {
 public:
  virtual ~DeviceInventory();
  virtual InventorySnapshot snapshot() = 0;
};

/// The host's inventory: NVML loaded with dlopen (libnvidia-ml.so.1, or $TRAINER_NVML_LIBRARY),
/// else the CUDA runtime through LibTorch when it has CUDA, else no GPUs; the CPU always.
/// GPUs are filtered and ordered by CUDA_VISIBLE_DEVICES so `index` is LibTorch's index.
TRAINER_API std::shared_ptr<DeviceInventory> system_inventory();

/// The inventory the device_select plugin and `trainer mem` use: the one set with
/// set_device_inventory, else system_inventory().
TRAINER_API std::shared_ptr<DeviceInventory> device_inventory();

/// Replaces the process's inventory (tests inject a scripted one); nullptr restores the host's.
TRAINER_API void set_device_inventory(std::shared_ptr<DeviceInventory> inventory);

/// Sets CUDA_DEVICE_ORDER=PCI_BUS_ID unless already set, so that the CUDA runtime numbers
/// GPUs in the driver's (NVML's) PCI-bus order. Returns a warning when the variable was set
/// to another order (indices may then disagree), empty otherwise. Call before CUDA starts.
TRAINER_API std::string prefer_pci_bus_order();

/// The physical GPUs a CUDA_VISIBLE_DEVICES value exposes, in LibTorch index order, as
/// positions in `uuids` (the driver's GPUs in PCI order). Unset (nullopt) exposes all. Like
/// the CUDA runtime: entries are indices or (prefixes of) UUIDs, an invalid or repeated entry
/// ends the list, an empty value or "-1" exposes none. `warning` receives what was ignored.
TRAINER_API std::vector<int> visible_gpus(const std::optional<std::string>& cuda_visible_devices,
                                          const std::vector<std::string>& uuids, std::string* warning = nullptr);

}  // namespace trainer
