// Device inventory (the real NVML loader against a fake libnvidia-ml.so.1), CUDA_VISIBLE_DEVICES
// mapping, leases and the device_select plugin (its real .so), including N concurrent processes.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <thread>

#include "devices/select_support.h"
#include "support/test_util.h"
#include "trainer/devices.h"
#include "trainer/distributed.h"
#include "trainer/lease.h"

namespace trainer::testing {
namespace {

// --- CUDA_VISIBLE_DEVICES ----------------------------------------------------------------
const std::vector<std::string> kUuids = {"GPU-aaaa-0", "GPU-bbbb-1", "GPU-cccc-2", "GPU-cccd-3"};

TEST(VisibleDevices, UnsetExposesAllInPciOrder) {
  EXPECT_EQ(visible_gpus(std::nullopt, kUuids), (std::vector<int>{0, 1, 2, 3}));
}

TEST(VisibleDevices, IndicesSelectAndReorder) {
  EXPECT_EQ(visible_gpus("2,0", kUuids), (std::vector<int>{2, 0}));
  EXPECT_EQ(visible_gpus(" 3 ", kUuids), (std::vector<int>{3}));
}

TEST(VisibleDevices, UuidsAndUniquePrefixes) {
  EXPECT_EQ(visible_gpus("GPU-bbbb-1,GPU-aaaa", kUuids), (std::vector<int>{1, 0}));
  std::string w;
  EXPECT_EQ(visible_gpus("GPU-ccc", kUuids, &w), std::vector<int>{});  // ambiguous: like CUDA, stops
  EXPECT_NE(w.find("ambiguous"), std::string::npos) << w;
}

TEST(VisibleDevices, AnInvalidEntryEndsTheListLikeTheCudaRuntime) {
  std::string w;
  EXPECT_EQ(visible_gpus("1,7,0", kUuids, &w), (std::vector<int>{1}));
  EXPECT_NE(w.find("no GPU 7 (the host has 4)"), std::string::npos) << w;
  w.clear();
  EXPECT_EQ(visible_gpus("0,0,1", kUuids, &w), (std::vector<int>{0}));
  EXPECT_NE(w.find("listed twice"), std::string::npos) << w;
  EXPECT_EQ(visible_gpus("", kUuids), std::vector<int>{});
  EXPECT_EQ(visible_gpus("-1", kUuids), std::vector<int>{});
}

TEST(VisibleDevices, PciBusOrderIsSetUnlessTheUserChoseAnother) {
  unsetenv("CUDA_DEVICE_ORDER");
  EXPECT_EQ(prefer_pci_bus_order(), "");
  EXPECT_STREQ(std::getenv("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
  setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST", 1);
  EXPECT_NE(prefer_pci_bus_order().find("FASTEST_FIRST"), std::string::npos);
  EXPECT_STREQ(std::getenv("CUDA_DEVICE_ORDER"), "FASTEST_FIRST");  // the user's choice stays
  unsetenv("CUDA_DEVICE_ORDER");
}

// --- the fake NVML library ---------------------------------------------------------------
/// Every test of this binary that touches the system inventory reaches NVML through the
/// fake library; each writes its own script.
class FakeNvml : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { setenv("TRAINER_NVML_LIBRARY", FAKE_NVML_LIBRARY, 1); }
  void SetUp() override {
    unsetenv("CUDA_VISIBLE_DEVICES");
    script_ = tmp_ / "nvml.txt";
    setenv("FAKE_NVML_CONFIG", script_.c_str(), 1);
    set_device_inventory(nullptr);
  }
  void TearDown() override { unsetenv("CUDA_VISIBLE_DEVICES"); }
  void script(const std::string& text) { write_file(script_, text); }
  /// A host whose NVML fails to start and that has no GPU: without NVML the inventory asks the
  /// CUDA runtime (in a CUDA build), which would find the GPU of a GPU machine, so the test hides
  /// it the way a user would. The runtime reads the variable when it starts: under ctest each
  /// test runs in a process of its own (run alone, the binary's earlier tests may have started it).
  static void no_gpu_for_the_cuda_runtime() { setenv("CUDA_VISIBLE_DEVICES", "", 1); }
  /// Four 16 GiB GPUs with the given used MiB and utilisation.
  void four_gpus(const std::vector<int>& used_mb, const std::vector<int>& util = {0, 0, 0, 0}) {
    std::string s;
    for (std::size_t i = 0; i < 4; ++i) {
      s += "gpu name=\"Fake GPU " + std::to_string(i) + "\" total_mb=16384 used_mb=" + std::to_string(used_mb[i]) +
           " util=" + std::to_string(util[i]) + "\n";
    }
    script(s);
  }
  std::string leases() const { return tmp_ / "leases"; }
  std::string lease_setting() const { return "lease_dir = \"" + leases() + "\"\n"; }

  TempDir tmp_;
  std::string script_;
};

TEST_F(FakeNvml, InventoryReadsNameMemoryUtilisationAndProcesses) {
  script(
      "gpu name=\"Fake A100\" uuid=GPU-a pci=00000000:3B:00.0 total_mb=40960 used_mb=1024 util=37 "
      "procs=4242:1000,self:24\n"
      "gpu name=\"Fake A100\" uuid=GPU-b total_mb=40960 used_mb=0\n");
  const InventorySnapshot s = system_inventory()->snapshot();
  EXPECT_EQ(s.source, "nvml");
  ASSERT_EQ(s.gpus.size(), 2u);
  const DeviceInfo& g = s.gpus[0];
  EXPECT_EQ(g.id, "cuda:0");
  EXPECT_EQ(g.name, "Fake A100");
  EXPECT_EQ(g.uuid, "GPU-a");
  EXPECT_EQ(g.pci_bus_id, "00000000:3B:00.0");
  EXPECT_EQ(g.total, 40960LL << 20);
  EXPECT_EQ(g.used, 1024LL << 20);
  EXPECT_EQ(g.free, (40960LL - 1024) << 20);
  EXPECT_EQ(g.utilization, 37);
  ASSERT_EQ(g.processes.size(), 2u);
  EXPECT_EQ(g.processes[0].pid, 4242);
  EXPECT_EQ(g.processes[0].used_bytes, 1000LL << 20);
  EXPECT_EQ(g.processes[1].pid, ::getpid());
  EXPECT_GT(s.cpu.total, 0);
  EXPECT_EQ(s.cpu.id, "cpu");
}

TEST_F(FakeNvml, VisibleDevicesMapLibTorchIndicesToPhysicalGpus) {
  four_gpus({0, 0, 0, 0});
  setenv("CUDA_VISIBLE_DEVICES", "GPU-fake-2,0", 1);
  const InventorySnapshot s = system_inventory()->snapshot();
  ASSERT_EQ(s.gpus.size(), 2u);
  EXPECT_EQ(s.gpus[0].id, "cuda:0");
  EXPECT_EQ(s.gpus[0].physical_index, 2);
  EXPECT_EQ(s.gpus[0].uuid, "GPU-fake-2");
  EXPECT_EQ(s.gpus[1].id, "cuda:1");
  EXPECT_EQ(s.gpus[1].physical_index, 0);
}

TEST_F(FakeNvml, InitFailureLeavesNoGpusAndSaysWhy) {
  script("init_error 999\ngpu total_mb=1024\n");
  no_gpu_for_the_cuda_runtime();
  const InventorySnapshot s = system_inventory()->snapshot();
  EXPECT_TRUE(s.gpus.empty());
  EXPECT_EQ(s.source, "none");
  ASSERT_FALSE(s.notes.empty());
  EXPECT_NE(s.notes[0].find("nvmlInit failed: Unknown Error (999)"), std::string::npos) << s.notes[0];
  EXPECT_GT(s.cpu.total, 0);
}

TEST_F(FakeNvml, APerGpuQueryFailureIsANoteNotAFailure) {
  script("gpu total_mb=1024 memory_error=15\ngpu total_mb=2048 used_mb=1024\n");
  const InventorySnapshot s = system_inventory()->snapshot();
  ASSERT_EQ(s.gpus.size(), 2u);
  EXPECT_EQ(s.gpus[0].free, -1);
  EXPECT_EQ(s.gpus[0].error, "memory: GPU is lost (15)");
  EXPECT_EQ(s.gpus[1].free, 1024LL << 20);
  EXPECT_EQ(s.gpus[1].error, "");
  // device_select passes the lost GPU over, although its free memory is "unknown", not low.
  DeviceSelect sel(lease_setting() + "allow_cpu_fallback = false\ndevice = \"cuda:0\"");
  const auto r = sel.select();
  EXPECT_EQ(r.exit_code, kExitNoDevice);
  EXPECT_NE(r.error.find("cuda:0 cannot be queried (memory: GPU is lost (15))"), std::string::npos) << r.error;
  ASSERT_EQ(s.notes.size(), 1u);
  EXPECT_NE(s.notes[0].find("GPU 0 memory: GPU is lost (15)"), std::string::npos) << s.notes[0];
}

// --- device_select against the fake NVML ---------------------------------------------------
TEST_F(FakeNvml, AutoPicksTheGpuWithTheMostFreeMemory) {
  four_gpus({9000, 1000, 5000, 12000});
  DeviceSelect sel(lease_setting());
  const auto r = sel.select();
  EXPECT_EQ(r.device, "cuda:1") << r.log;
  EXPECT_NE(r.log.find("4 GPU(s) via nvml"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("chose cuda:1 (Fake GPU 1, 15.0 GiB free"), std::string::npos) << r.log;
}

TEST_F(FakeNvml, EqualFreeMemoryGoesToTheLessBusyGpu) {
  four_gpus({1000, 1000, 1010, 1000}, {80, 60, 5, 20});  // 1010 vs 1000 MiB used: the same 256 MiB step
  DeviceSelect sel(lease_setting());
  EXPECT_EQ(sel.select().device, "cuda:2");
}

TEST_F(FakeNvml, MinFreeFiltersAndTheFallbackIsTheCpu) {
  four_gpus({9000, 8000, 9000, 9000});  // at most 8 GiB free
  DeviceSelect sel(lease_setting() + "min_free_mb = 10000");
  const auto r = sel.select();
  EXPECT_EQ(r.device, "cpu") << r.log;
  EXPECT_NE(r.log.find("cuda:1 has 8384 MiB free, below min_free_mb = 10000"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("falling back to the CPU"), std::string::npos) << r.log;
}

TEST_F(FakeNvml, SelectionHonoursVisibleDevicesAndReportsLibTorchIndices) {
  four_gpus({9000, 0, 5000, 12000});  // physical 1 is the freest, but hidden
  setenv("CUDA_VISIBLE_DEVICES", "3,2", 1);
  DeviceSelect sel(lease_setting());
  const auto r = sel.select();
  EXPECT_EQ(r.device, "cuda:1") << r.log;  // physical 2, LibTorch's index 1
  EXPECT_NE(r.log.find("cuda:1 Fake GPU 2 [GPU-fake-2]"), std::string::npos) << r.log;
}

TEST_F(FakeNvml, AnExplicitGpuBeyondTheVisibleOnesIsAUsageError) {
  four_gpus({0, 0, 0, 0});
  DeviceSelect sel(lease_setting() + "device = \"cuda:4\"");
  const auto r = sel.select();
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.error.find("this process sees 4 GPU(s)"), std::string::npos) << r.error;
}

TEST_F(FakeNvml, NoGpusAtAllFallsBackWithoutWaiting) {
  script("init_error 9\n");
  no_gpu_for_the_cuda_runtime();
  // A check every 10 minutes: a select that waited for even one would hang the test, not pass.
  DeviceSelect sel(lease_setting() + "wait_for_gpu = true\ncheck_interval_s = 600\ntimeout_min = 10");
  const auto r = sel.select();
  EXPECT_EQ(r.device, "cpu");
  EXPECT_NE(r.log.find("no GPU visible to this process"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("Driver Not Loaded"), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("after waiting"), std::string::npos) << r.log;  // it did not wait
  // An explicit GPU on a host without any follows the same fallback rule.
  DeviceSelect explicit_gpu(lease_setting() + "device = \"cuda\"");
  EXPECT_EQ(explicit_gpu.select().device, "cpu");
}

TEST_F(FakeNvml, WaitsUntilMemoryFreesThenTakesTheGpu) {
  script("gpu total_mb=16384 used_mb=16000\n");
  DeviceSelect sel(lease_setting() +
                   "min_free_mb = 4096\nwait_for_gpu = true\ncheck_interval_s = 0.2\ntimeout_min = 1");
  std::thread freer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    script("gpu total_mb=16384 used_mb=1000\n");
  });
  const auto r = sel.select();
  freer.join();
  EXPECT_EQ(r.device, "cuda:0") << r.log;
  EXPECT_NE(r.log.find("check 1: no usable GPU: cuda:0 has 384 MiB free, below min_free_mb = 4096"), std::string::npos)
      << r.log;
}

// --- device_select with an injected inventory ---------------------------------------------
/// Full GPUs for the first `busy_checks` snapshots, then free ones.
class ScriptedInventory : public DeviceInventory {
 public:
  ScriptedInventory(int gpus, int busy_checks) : gpus_(gpus), busy_(busy_checks) {}
  InventorySnapshot snapshot() override {
    InventorySnapshot s;
    s.source = "scripted";
    s.cpu.id = "cpu";
    const bool busy = calls++ < busy_;
    for (int i = 0; i < gpus_; ++i) {
      DeviceInfo d;
      d.id = "cuda:" + std::to_string(i);
      d.index = d.physical_index = i;
      d.name = "Scripted";
      d.uuid = "GPU-scripted-" + std::to_string(i);
      d.total = 8LL << 30;
      d.free = busy ? 100LL << 20 : 7LL << 30;
      d.used = d.total - d.free;
      s.gpus.push_back(d);
    }
    return s;
  }
  int calls = 0;

 private:
  int gpus_, busy_;
};

class InjectedInventory : public FakeNvml {
 protected:
  void TearDown() override {
    set_device_inventory(nullptr);
    FakeNvml::TearDown();
  }
};

TEST_F(InjectedInventory, WaitThenSucceedPollsAtTheInterval) {
  auto inv = std::make_shared<ScriptedInventory>(2, 3);
  set_device_inventory(inv);
  DeviceSelect sel(lease_setting() + "min_free_mb = 1024\nwait_for_gpu = true\ncheck_interval_s = 0.02");
  const auto r = sel.select();
  EXPECT_EQ(r.device, "cuda:0") << r.log;
  EXPECT_EQ(inv->calls, 4);
  for (int c = 1; c <= 3; ++c)
    EXPECT_NE(r.log.find("check " + std::to_string(c) + ": no usable GPU"), std::string::npos);
  EXPECT_EQ(r.log.find("check 4"), std::string::npos) << r.log;
}

TEST_F(InjectedInventory, TimeoutThenCpuFallback) {
  set_device_inventory(std::make_shared<ScriptedInventory>(2, 1000000));
  DeviceSelect sel(lease_setting() +
                   "min_free_mb = 1024\nwait_for_gpu = true\ncheck_interval_s = 0.05\ntimeout_min = 0.005");
  const auto r = sel.select();
  EXPECT_EQ(r.device, "cpu") << r.log;
  EXPECT_NE(r.log.find("no usable GPU after waiting"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("falling back to the CPU"), std::string::npos) << r.log;
}

TEST_F(InjectedInventory, TimeoutWithoutFallbackEndsWithExitCode4) {
  set_device_inventory(std::make_shared<ScriptedInventory>(2, 1000000));
  DeviceSelect sel(lease_setting() +
                   "min_free_mb = 1024\nwait_for_gpu = true\ncheck_interval_s = 0.05\ntimeout_min = 0.005\n"
                   "allow_cpu_fallback = false");
  const auto r = sel.select();
  EXPECT_EQ(r.exit_code, kExitNoDevice);
  EXPECT_EQ(r.device, "");
  EXPECT_NE(r.error.find("no usable GPU after waiting"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("cuda:1 has 100 MiB free, below min_free_mb = 1024"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("Options: a longer timeout_min, a lower min_free_mb"), std::string::npos) << r.error;
}

TEST_F(InjectedInventory, AnInterruptEndsTheWait) {
  set_device_inventory(std::make_shared<ScriptedInventory>(1, 1000000));
  DeviceSelect sel(lease_setting() + "min_free_mb = 1024\nwait_for_gpu = true\ncheck_interval_s = 30");
  std::thread t([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    request_interrupt();
  });
  const auto r = sel.select();
  t.join();
  clear_interrupt();
  EXPECT_EQ(r.exit_code, kExitInterrupted);
  EXPECT_NE(r.error.find("interrupted while waiting for a GPU"), std::string::npos);
}

// --- leases ---------------------------------------------------------------------------------
TEST_F(InjectedInventory, ALeasedGpuIsPassedOverAndFreedOnShutdown) {
  set_device_inventory(std::make_shared<ScriptedInventory>(2, 0));
  auto first = std::make_unique<DeviceSelect>(lease_setting(), "runs/first");
  EXPECT_EQ(first->select().device, "cuda:0");
  {
    DeviceSelect second(lease_setting(), "runs/second");
    const auto r = second.select();
    EXPECT_EQ(r.device, "cuda:1") << r.log;
    EXPECT_NE(r.log.find("cuda:0 is leased by pid " + std::to_string(::getpid()) + " (exclusive, since "),
              std::string::npos)
        << r.log;
    EXPECT_NE(r.log.find("runs/first)"), std::string::npos) << r.log;
    DeviceSelect third(lease_setting() + "allow_cpu_fallback = false");
    EXPECT_EQ(third.select().exit_code, kExitNoDevice);
  }
  first.reset();  // Shutdown releases cuda:0
  DeviceSelect again(lease_setting());
  EXPECT_EQ(again.select().device, "cuda:0");
}

TEST_F(InjectedInventory, SharingJobsCoLocateButNotWithAnExclusiveOne) {
  set_device_inventory(std::make_shared<ScriptedInventory>(1, 0));
  DeviceSelect a(lease_setting() + "share = true"), b(lease_setting() + "share = true");
  EXPECT_EQ(a.select().device, "cuda:0");
  EXPECT_EQ(b.select().device, "cuda:0");
  DeviceSelect exclusive(lease_setting() + "allow_cpu_fallback = false");
  const auto r = exclusive.select();
  EXPECT_EQ(r.exit_code, kExitNoDevice) << r.log;
  EXPECT_NE(r.error.find("(shared"), std::string::npos) << r.error;
}

TEST_F(InjectedInventory, AStaleHolderFileWithALivePidDoesNotBlockAGpu) {
  // pid 1 is alive but holds no lock: a holder file left behind, its pid reused since.
  set_device_inventory(std::make_shared<ScriptedInventory>(1, 0));
  write_file(leases() + "/GPU-scripted-0.1.holder", "pid=1\nhost=x\nshared=0\nsince=2026-01-01 00:00:00\nnote=old\n");
  write_file(leases() + "/GPU-scripted-0.lock", "");
  DeviceSelect sel(lease_setting() + "allow_cpu_fallback = false");
  const auto r = sel.select();
  EXPECT_EQ(r.device, "cuda:0") << r.log << r.error;
  EXPECT_NE(r.log.find("reclaimed the stale lease of pid 1 "), std::string::npos) << r.log;
  EXPECT_FALSE(std::filesystem::exists(leases() + "/GPU-scripted-0.1.holder"));
}

TEST_F(InjectedInventory, TheLeaseFollowsTheRunAfterADeviceFallback) {
  set_device_inventory(std::make_shared<ScriptedInventory>(2, 0));
  DeviceSelect first(lease_setting(), "runs/first");
  ASSERT_EQ(first.select().device, "cuda:0");
  const std::string log = first.moved_to("cuda:1");  // its oom_backoff fell back to cuda:1
  EXPECT_NE(log.find("the run moved to cuda:1; lease "), std::string::npos) << log;
  DeviceSelect second(lease_setting() + "allow_cpu_fallback = false", "runs/second");
  const auto r = second.select();
  EXPECT_EQ(r.device, "cuda:0") << r.log << r.error;  // released by the first run
  EXPECT_NE(r.log.find("cuda:1 is leased by pid " + std::to_string(::getpid())), std::string::npos) << r.log;
  // A move to the CPU gives the GPU lease back.
  first.moved_to("cpu");
  DeviceSelect third(lease_setting() + "allow_cpu_fallback = false");
  EXPECT_EQ(third.select().device, "cuda:1");
}

TEST_F(InjectedInventory, MigInstancesInVisibleDevicesAreAClearErrorNotACpuFallback) {
  set_device_inventory(std::make_shared<ScriptedInventory>(1, 0));
  setenv("CUDA_VISIBLE_DEVICES", "MIG-GPU-aaaa/1/0", 1);
  DeviceSelect sel(lease_setting());
  const auto r = sel.select();
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_EQ(r.device, "");
  EXPECT_NE(r.error.find("CUDA_VISIBLE_DEVICES=MIG-GPU-aaaa/1/0 names MIG instances"), std::string::npos) << r.error;
}

TEST_F(FakeNvml, TheLeaseDirectoryAndItsFilesAreCheckedBeforeUse) {
  namespace fs = std::filesystem;
  auto refused = [](const std::string& dir) {
    try {
      DeviceLease::try_acquire(dir, "GPU-x", false, "test");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  fs::create_directories(tmp_ / "real");
  fs::create_symlink(tmp_ / "real", tmp_ / "link");
  EXPECT_NE(refused(tmp_ / "link").find("is a symbolic link; refusing it"), std::string::npos);
  fs::create_directories(tmp_ / "open");
  fs::permissions(tmp_ / "open", fs::perms::all);  // 0777, no sticky bit
  EXPECT_NE(refused(tmp_ / "open").find("writable by others without the sticky bit"), std::string::npos);
  fs::permissions(tmp_ / "open", fs::perms::all | fs::perms::sticky_bit);  // like /tmp
  EXPECT_EQ(refused(tmp_ / "open"), "accepted");
  fs::create_directories(tmp_ / "trap");
  write_file(tmp_ / "victim", "");
  fs::create_symlink(tmp_ / "victim", tmp_ / "trap/GPU-x.lock");
  EXPECT_NE(refused(tmp_ / "trap").find("GPU-x.lock is a symbolic link; refusing it"), std::string::npos);
}

TEST_F(InjectedInventory, LeasesCanBeTurnedOff) {
  set_device_inventory(std::make_shared<ScriptedInventory>(1, 0));
  DeviceSelect a(lease_setting()), b(lease_setting() + "lease = false");
  EXPECT_EQ(a.select().device, "cuda:0");
  EXPECT_EQ(b.select().device, "cuda:0");
}

// --- real processes -------------------------------------------------------------------------
std::string probe_command(const std::string& args) { return std::string(DEVICE_SELECT_PROBE) + " " + args; }

TEST_F(FakeNvml, ConcurrentJobsSpreadOverTheGpus) {
  four_gpus({0, 0, 0, 0});  // identical GPUs: every job's first choice is the same one
  const int kJobs = 5;
  std::vector<FILE*> pipes;
  for (int i = 0; i < kJobs; ++i) {
    pipes.push_back(popen(probe_command("--hold 4 'lease_dir = \"" + leases() + "\"' 2>/dev/null").c_str(), "r"));
    ASSERT_NE(pipes.back(), nullptr);
  }
  std::multiset<std::string> chosen;
  for (FILE* p : pipes) {
    char buf[256] = {};
    std::string out;
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    EXPECT_EQ(pclose(p), 0) << out;
    ASSERT_EQ(out.rfind("selected ", 0), 0u) << out;
    chosen.insert(out.substr(9, out.find('\n') - 9));
  }
  EXPECT_EQ(chosen, (std::multiset<std::string>{"cpu", "cuda:0", "cuda:1", "cuda:2", "cuda:3"}));
}

TEST_F(FakeNvml, AStaleLeaseOfAKilledJobIsReclaimed) {
  script("gpu uuid=GPU-only total_mb=16384\n");
  const std::string out = tmp_ / "probe.out";
  Child holder(probe_command("--hold 60 'lease_dir = \"" + leases() + "\"' >" + out + " 2>&1"));
  ASSERT_TRUE(holder.started());
  const pid_t pid = holder.pid();
  ASSERT_TRUE(wait_for_text(out, "selected", std::chrono::seconds(60))) << read_file(out);
  ASSERT_NE(read_file(out).find("selected cuda:0"), std::string::npos) << read_file(out);
  {
    DeviceSelect blocked(lease_setting() + "allow_cpu_fallback = false");
    EXPECT_EQ(blocked.select().exit_code, kExitNoDevice);  // the live job holds it
  }
  ASSERT_TRUE(holder.signal(SIGKILL));
  holder.wait();  // reaped: no zombie keeps the pid alive
  ASSERT_NE(::kill(pid, 0), 0);
  DeviceSelect sel(lease_setting() + "allow_cpu_fallback = false");
  const auto r = sel.select();
  EXPECT_EQ(r.device, "cuda:0") << r.log << r.error;
  EXPECT_NE(r.log.find("reclaimed the stale lease of pid " + std::to_string(pid)), std::string::npos) << r.log;
  EXPECT_FALSE(std::filesystem::exists(leases() + "/GPU-only." + std::to_string(pid) + ".holder"));
}

TEST_F(FakeNvml, InADataParallelLaunchEachRankTakesItsOwnGpu) {
  four_gpus({0, 0, 0, 0});
  const auto rank = [](int r) {
    return "RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
           " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ";
  };
  // Plain "cuda": the GPU numbered LOCAL_RANK among the visible ones.
  auto o = run_command(rank(1) + probe_command("'device = \"cuda\"' 'lease = false'"));
  EXPECT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("selected cuda:1"), std::string::npos) << o.text;
  setenv("CUDA_VISIBLE_DEVICES", "3,2", 1);
  o = run_command(rank(1) + probe_command("'device = \"cuda\"' 'lease = false'"));
  EXPECT_NE(o.text.find("selected cuda:1"), std::string::npos) << o.text;  // the second visible one
  unsetenv("CUDA_VISIBLE_DEVICES");
  // A launcher that gives each rank its own CUDA_VISIBLE_DEVICES: the one GPU the rank sees.
  setenv("CUDA_VISIBLE_DEVICES", "2", 1);
  o = run_command(rank(1) + probe_command("'device = \"cuda\"' 'lease = false'"));
  EXPECT_NE(o.text.find("selected cuda:0"), std::string::npos) << o.text;
  unsetenv("CUDA_VISIBLE_DEVICES");
  // One GPU and "auto" with share = true: the ranks' leases stay exclusive, so the second rank
  // does not get the GPU the first holds (it falls back to the CPU).
  script("gpu uuid=GPU-only total_mb=16384\n");
  const std::string out0 = tmp_ / "r0.out", out1 = tmp_ / "r1.out";
  const std::string args = " --hold 4 'share = true' 'lease_dir = \"" + leases() + "\"' > ";
  Child r0("env " + rank(0) + probe_command(args + out0 + " 2>&1"));
  Child r1("env " + rank(1) + probe_command(args + out1 + " 2>&1"));
  EXPECT_EQ(WEXITSTATUS(r0.wait()), 0) << read_file(out0);
  EXPECT_EQ(WEXITSTATUS(r1.wait()), 0) << read_file(out1);
  const std::string a = read_file(out0), b = read_file(out1);
  const auto chosen = [](const std::string& t) {
    const auto p = t.find("selected ");
    return p == std::string::npos ? std::string("none") : t.substr(p + 9, t.find('\n', p) - p - 9);
  };
  EXPECT_EQ((std::multiset<std::string>{chosen(a), chosen(b)}), (std::multiset<std::string>{"cpu", "cuda:0"}))
      << a << b;
  EXPECT_NE(a.find("share = true is ignored in a data-parallel launch"), std::string::npos) << a;
}

TEST(SharedGpu, TwoRanksOnOneGpuOfAHostAreNamed) {
  EXPECT_EQ(shared_gpu({"a cuda:0", "a cuda:1", "b cuda:0"}), "");
  EXPECT_EQ(shared_gpu({"a cpu", "a cpu"}), "");
  EXPECT_EQ(shared_gpu({"a cuda:0", "b cuda:1", "b cuda:1"}), "ranks 1 and 2 both use cuda:1 on host b");
  EXPECT_EQ(shared_gpu({"a 3", "a 3"}), "ranks 0 and 1 both use GPU 3 on host a");
  // Each rank names the GPU by its entry in CUDA_VISIBLE_DEVICES, so ranks that see one GPU
  // each (as cuda:0) are told apart.
  setenv("CUDA_VISIBLE_DEVICES", "3, GPU-b", 1);
  EXPECT_EQ(physical_gpu(c10::Device("cuda:0")), "3");
  EXPECT_EQ(physical_gpu(c10::Device("cuda:1")), "GPU-b");
  EXPECT_EQ(physical_gpu(c10::Device("cuda:2")), "cuda:2");
  unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(physical_gpu(c10::Device("cuda:1")), "cuda:1");
  EXPECT_EQ(physical_gpu(c10::Device("cpu")), "cpu");
}

}  // namespace
}  // namespace trainer::testing
