// device_select: picks the run's device on a shared host (SelectDevice). "auto" takes the
// visible GPU with the most free memory above min_free_mb that no other job holds a lease
// on; when none qualifies it waits (wait_for_gpu), then falls back to the CPU or ends the
// run with exit code 4. The lease (a flock'ed file per GPU) is held until the run ends. In a
// data-parallel launch each rank takes its own GPU: "cuda" is cuda:<LOCAL_RANK>, and "auto"'s
// exclusive leases keep two ranks off one GPU.
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>
#include <thread>

#include "trainer/devices.h"
#include "trainer/distributed.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"
#include "trainer/lease.h"
#include "trainer/memory.h"
#include "trainer/plugin.h"

namespace {

using trainer::DeviceInfo;
using trainer::DeviceLease;
using trainer::format_bytes;

/// Free memory is compared in steps of this size: idle GPUs of one model differ by a few
/// MiB of driver overhead, which should not outweigh utilisation.
constexpr std::int64_t kFreeStep = 256LL << 20;

std::string duration_text(double seconds) {
  std::ostringstream os;
  if (seconds < 60) {
    os << std::round(seconds * 10) / 10 << " s";
  } else {
    const auto s = static_cast<std::int64_t>(seconds);
    os << s / 60 << " min " << s % 60 << " s";
  }
  return os.str();
}

struct Candidate {
  const DeviceInfo* gpu;
  std::size_t holders = 0;
};

struct DeviceSelectSettings : trainer::Settings<DeviceSelectSettings> {
  std::string device = "auto";
  double min_free_mb = 0.0;
  bool wait_for_gpu = false;
  double check_interval_s = 30.0;
  double timeout_min = 60.0;
  bool allow_cpu_fallback = true;
  bool lease = true;
  bool share = false;
  std::string lease_dir;

  static void declare(trainer::SettingsSchema<DeviceSelectSettings>& s) {
    using S = DeviceSelectSettings;
    s.add(&S::device, "device", "auto: the best GPU, else the fallback rules; cpu; cuda or cuda:N: that GPU")
        .check(trainer::device_setting_check(/*allow_auto=*/true));
    s.add(&S::min_free_mb, "min_free_mb", "A GPU needs at least this much free memory (MiB)").min(0).max(1e9);
    s.add(&S::wait_for_gpu, "wait_for_gpu", "When no GPU qualifies, poll until one does or timeout_min passes");
    s.add(&S::check_interval_s, "check_interval_s", "Seconds between checks while waiting").min(0.01).max(86400);
    s.add(&S::timeout_min, "timeout_min", "Minutes to wait for a GPU").min(0).max(1e6);
    s.add(&S::allow_cpu_fallback, "allow_cpu_fallback", "Run on the CPU when no GPU qualifies (else exit code 4)");
    s.add(&S::lease, "lease", "Take a host-wide lease on the chosen GPU so other jobs pick another");
    s.add(&S::share, "share", "Accept a GPU other sharing jobs hold (not exclusive ones) when memory permits");
    s.add(&S::lease_dir, "lease_dir", "Directory of the lease files; empty: $TRAINER_LEASE_DIR or /tmp/trainer-leases");
  }
};

class DeviceSelectPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "device_select"; }
  std::string description() const override {
    return "Choose the device: the GPU with the most free memory, waiting for one, with a host-wide lease";
  }
  std::vector<trainer::Event> events() const override {
    return {trainer::Event::SelectDevice, trainer::Event::ModelToDevice, trainer::Event::Shutdown};
  }
  trainer::FailurePolicy default_policy() const override { return trainer::FailurePolicy::Essential; }
  std::vector<trainer::KeySpec> config_keys() const override { return DeviceSelectSettings::keys(); }

  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    const auto s = DeviceSelectSettings::from(section);
    const auto device = trainer::parse_device_setting(s.device, /*allow_auto=*/true);
    TRAINER_CHECK_T(trainer::UsageError, device, "plugins.device_select.device = \"", s.device, "\": must be ",
                    trainer::device_setting_check(true).rule);
    device_ = s.device;
    wanted_index_ = device->index;
    if (device->kind == trainer::DeviceSetting::Kind::Cpu) cpu_only_ = true;
    share_ = s.share;
    // A data-parallel launch: plain "cuda" is this rank's own GPU (LOCAL_RANK among the visible
    // ones), and the ranks' leases are exclusive, so that "auto" gives each its own GPU.
    if (const auto local = trainer::local_rank_of_this_process(); local >= 0) {
      if (s.device == "cuda") {
        wanted_index_ = static_cast<int>(local);
        by_local_rank_ = true;
        device_ = "cuda (cuda:" + std::to_string(local) + ", LOCAL_RANK)";
      }
      if (share_) {
        logger_->warn("device_select: share = true is ignored in a data-parallel launch: each rank takes its own GPU");
        share_ = false;
      }
    }
    min_free_ = static_cast<std::int64_t>(s.min_free_mb * 1048576.0);
    wait_ = s.wait_for_gpu;
    interval_s_ = s.check_interval_s;
    timeout_s_ = s.timeout_min * 60.0;
    cpu_fallback_ = s.allow_cpu_fallback;
    use_lease_ = s.lease;
    lease_dir_ = s.lease_dir.empty() ? DeviceLease::default_dir() : s.lease_dir;
    // Before anything starts CUDA: CUDA must number GPUs as the driver does.
    if (const std::string w = trainer::prefer_pci_bus_order(); !w.empty()) logger_->warn("device_select: {}", w);
  }

  void on_event(trainer::EventContext& ctx, trainer::Control& control) override {
    if (ctx.event == trainer::Event::Shutdown) {
      if (lease_) {
        logger_->debug("device_select: releasing {}", lease_->lock_path());
        lease_.reset();
      }
      return;
    }
    if (ctx.event == trainer::Event::ModelToDevice) {
      follow(ctx);
      return;
    }
    if (cpu_only_) {
      choose_cpu(ctx, control, "device = cpu");
      return;
    }
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && std::string(v).find("MIG-") != std::string::npos) {
      throw trainer::UsageError(std::string("CUDA_VISIBLE_DEVICES=") + v +
                                " names MIG instances, which device_select cannot query or lease (NVML reports whole "
                                "GPUs); list GPU indices or UUIDs instead, or run without device_select "
                                "(runtime.device = \"cuda\": LibTorch sees the first MIG instance as cuda:0)");
    }
    const auto inventory = trainer::device_inventory();
    const auto start = std::chrono::steady_clock::now();
    const auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    std::string reasons;
    bool waited_any = false;
    for (int check = 1;; ++check) {
      const trainer::InventorySnapshot snap = inventory->snapshot();
      if (check == 1) describe(snap);
      // A launcher that gives each rank its own CUDA_VISIBLE_DEVICES: the one GPU it sees.
      if (by_local_rank_ && snap.gpus.size() == 1) wanted_index_ = 0;
      // A GPU index past the visible ones is a setting that cannot work (no GPU at all is the
      // fallback's case).
      if (wanted_index_ >= 0 && !snap.gpus.empty() && wanted_index_ >= static_cast<int>(snap.gpus.size())) {
        throw trainer::UsageError("plugins.device_select.device = \"" + device_ + "\": this process sees " +
                                  std::to_string(snap.gpus.size()) + " GPU(s)" + visible_text());
      }
      if (try_select(snap, ctx, control, reasons)) return;
      if (snap.gpus.empty()) {
        reasons = "no GPU visible to this process" + visible_text() + notes_text(snap);
        break;  // waiting does not make a GPU appear
      }
      const double waited = elapsed();
      if (!wait_ || waited + interval_s_ > timeout_s_) break;
      logger_->info("device_select: check {}: no usable GPU: {}; next check in {} (waited {} of {})", check, reasons,
                    duration_text(interval_s_), duration_text(waited), duration_text(timeout_s_));
      sleep_interruptibly(interval_s_);
      waited_any = true;
    }
    const std::string waited = waited_any ? " after waiting " + duration_text(elapsed()) : "";
    if (cpu_fallback_) {
      logger_->warn("device_select: no usable GPU{} ({}); falling back to the CPU", waited, reasons);
      choose_cpu(ctx, control, "fallback: no usable GPU");
      return;
    }
    throw trainer::ExitRequest(trainer::kExitNoDevice, trainer::RunStatus::Failed,
                               "device_select: no usable GPU" + waited + " (" + reasons +
                                   "); allow_cpu_fallback = false, so the run ends. Options: " +
                                   (wait_ ? "a longer timeout_min" : "wait_for_gpu = true") +
                                   ", a lower min_free_mb, share = true, or allow_cpu_fallback = true");
  }

 private:
  static std::string visible_text() {
    const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
    return v ? std::string(" (CUDA_VISIBLE_DEVICES=") + v + ")" : "";
  }
  static std::string notes_text(const trainer::InventorySnapshot& snap) {
    std::string s;
    for (const auto& n : snap.notes) s += "; " + n;
    return s;
  }

  void describe(const trainer::InventorySnapshot& snap) const {
    // With no GPU at all, the notes (why) come with the fallback line instead.
    logger_->info("device_select: {} GPU(s) via {}{}", snap.gpus.size(), snap.source,
                  snap.gpus.empty() ? "" : notes_text(snap));
    for (const auto& g : snap.gpus) {
      logger_->info("device_select:   {} {} [{}]: {} free of {}, utilisation {}, {} process(es)", g.id, g.name,
                    g.uuid.empty() ? g.pci_bus_id : g.uuid, g.free < 0 ? "unknown" : format_bytes(g.free),
                    g.total < 0 ? "unknown" : format_bytes(g.total),
                    g.utilization < 0 ? std::string("unknown") : std::to_string(g.utilization) + " %",
                    g.processes.size());
    }
  }

  static std::string lease_key(const DeviceInfo& g) {
    if (!g.uuid.empty()) return g.uuid;
    if (!g.pci_bus_id.empty()) return "pci-" + g.pci_bus_id;
    return "cuda-" + std::to_string(g.physical_index >= 0 ? g.physical_index : g.index);
  }

  /// One pass over the snapshot: filters, orders, takes the first lease it can. Fills
  /// `reasons` with why each GPU was passed over.
  bool try_select(const trainer::InventorySnapshot& snap, trainer::EventContext& ctx, trainer::Control& control,
                  std::string& reasons) {
    std::vector<std::string> rejected;
    std::vector<Candidate> ok;
    for (const auto& g : snap.gpus) {
      if (wanted_index_ >= 0 && g.index != wanted_index_) continue;
      if (!g.error.empty()) {
        rejected.push_back(g.id + " cannot be queried (" + g.error + ")");
        continue;
      }
      if (g.free >= 0 && g.free < min_free_) {
        // In MiB, the unit of the setting (rounded GiB could read "38.8 GiB below 38.8 GiB").
        rejected.push_back(g.id + " has " + std::to_string(g.free >> 20) +
                           " MiB free, below min_free_mb = " + std::to_string(min_free_ >> 20));
        continue;
      }
      Candidate c{&g, 0};
      if (use_lease_) {
        // The lock decides: a stale holder file (or a reused pid) does not block a GPU.
        const trainer::LeaseState st = DeviceLease::probe(lease_dir_, lease_key(g));
        if (st.held && (!share_ || st.exclusive)) {
          const auto who = std::find_if(st.holders.begin(), st.holders.end(),
                                        [&](const trainer::LeaseHolder& h) { return h.shared != st.exclusive; });
          rejected.push_back(g.id + " is leased by " +
                             (who != st.holders.end() ? who->describe()
                              : st.holders.empty()    ? std::string("another job")
                                                      : st.holders.front().describe()));
          continue;
        }
        c.holders = st.held ? std::max<std::size_t>(1, st.holders.size()) : 0;
      }
      ok.push_back(c);
    }
    std::sort(ok.begin(), ok.end(), [](const Candidate& a, const Candidate& b) {
      if (a.holders != b.holders) return a.holders < b.holders;
      const std::int64_t fa = a.gpu->free / kFreeStep, fb = b.gpu->free / kFreeStep;
      if (fa != fb) return fa > fb;
      const int ua = a.gpu->utilization < 0 ? 101 : a.gpu->utilization;
      const int ub = b.gpu->utilization < 0 ? 101 : b.gpu->utilization;
      if (ua != ub) return ua < ub;
      return a.gpu->index < b.gpu->index;
    });
    for (const Candidate& c : ok) {
      const DeviceInfo& g = *c.gpu;
      if (use_lease_) {
        std::vector<trainer::LeaseHolder> holders, reclaimed;
        auto lease = DeviceLease::try_acquire(lease_dir_, lease_key(g), share_, ctx.run_dir, &holders, &reclaimed);
        for (const auto& h : reclaimed) {
          logger_->info("device_select: reclaimed the stale lease of {} on {} (the process is gone)", h.describe(),
                        g.id);
        }
        if (!lease) {  // another job took it between our look and our lock
          rejected.push_back(g.id + " was just leased by " +
                             (holders.empty() ? std::string("another job") : holders.front().describe()));
          continue;
        }
        lease_ = std::move(lease);
        leased_device_ = g.id;
      }
      if (g.free < 0 && min_free_ > 0) {
        logger_->warn("device_select: free memory of {} is unknown (no NVML); min_free_mb not checked", g.id);
      }
      logger_->info("device_select: chose {} ({}, {} free, utilisation {}){}{}", g.id, g.name,
                    g.free < 0 ? "unknown" : format_bytes(g.free),
                    g.utilization < 0 ? std::string("unknown") : std::to_string(g.utilization) + " %",
                    lease_ ? std::string(", lease ") + lease_->lock_path() + (share_ ? " (shared)" : "") : "",
                    rejected.empty() ? "" : "; passed over: " + fmt::to_string(fmt::join(rejected, "; ")));
      control.switch_device = g.id;
      control.reason = "most free memory of the GPUs that qualify";
      ctx.device = c10::Device(g.id);
      return true;
    }
    reasons = rejected.empty() ? "no GPU matches device = " + device_ : fmt::to_string(fmt::join(rejected, "; "));
    return false;
  }

  /// ModelToDevice: after an out-of-memory device fallback the lease moves with the run:
  /// taken on the new GPU (if it can be), released on the old one.
  void follow(const trainer::EventContext& ctx) {
    const std::string now = ctx.device.str();
    if (!use_lease_ || now == leased_device_ || (!lease_ && !ctx.device.is_cuda())) return;
    std::unique_ptr<DeviceLease> next;
    std::string why;
    if (ctx.device.is_cuda()) {
      const trainer::InventorySnapshot snap = trainer::device_inventory()->snapshot();
      const auto g = std::find_if(snap.gpus.begin(), snap.gpus.end(), [&](const DeviceInfo& d) { return d.id == now; });
      if (g == snap.gpus.end()) {
        why = "the inventory does not list it";
      } else {
        std::vector<trainer::LeaseHolder> holders;
        next = DeviceLease::try_acquire(lease_dir_, lease_key(*g), share_, ctx.run_dir, &holders);
        if (!next)
          why = "it is leased by " + (holders.empty() ? std::string("another job") : holders.front().describe());
      }
    }
    if (lease_)
      logger_->info("device_select: the run left {}; released its lease {}", leased_device_, lease_->lock_path());
    lease_ = std::move(next);
    leased_device_ = now;
    if (lease_) {
      logger_->info("device_select: the run moved to {}; lease {}", now, lease_->lock_path());
    } else if (ctx.device.is_cuda()) {
      logger_->warn("device_select: the run moved to {} without a lease: {}", now, why);
    }
  }

  void choose_cpu(trainer::EventContext& ctx, trainer::Control& control, const std::string& why) {
    leased_device_ = "cpu";
    logger_->info("device_select: chose cpu ({})", why);
    control.switch_device = "cpu";
    control.reason = why;
    ctx.device = c10::Device(c10::kCPU);
  }

  /// Sleeps, waking every 50 ms to honour SIGINT/SIGTERM (the run ends with exit code 130).
  static void sleep_interruptibly(double seconds) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      if (trainer::interrupt_requested()) {
        throw trainer::ExitRequest(trainer::kExitInterrupted, trainer::RunStatus::Killed,
                                   "interrupted while waiting for a GPU");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  std::string device_, lease_dir_;
  int wanted_index_ = -1;  ///< cuda / cuda:N: that GPU only; -1: any (auto)
  bool cpu_only_ = false;
  bool by_local_rank_ = false;  ///< "cuda" in a data-parallel launch: LOCAL_RANK's GPU
  std::int64_t min_free_ = 0;
  bool wait_ = false, cpu_fallback_ = true, use_lease_ = true, share_ = false;
  double interval_s_ = 30, timeout_s_ = 3600;
  std::unique_ptr<DeviceLease> lease_;
  std::string leased_device_;  ///< the device the run is on as this plugin last saw it ("cuda:0", "cpu")
};

}  // namespace

TRAINER_PLUGIN(DeviceSelectPlugin)
