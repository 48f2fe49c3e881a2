// device_select_probe [--hold SECONDS] [SETTING ...]: selects a device with the real
// device_select plugin against the host's inventory (tests point it at the fake NVML),
// prints "selected <device>" and holds the lease for SECONDS before Shutdown releases it.
// Exit code: the plugin's (4: no device, 2: bad settings), else 0.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "devices/select_support.h"

int main(int argc, char** argv) {
  double hold = 0;
  std::string settings;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--hold" && i + 1 < argc) {
      hold = std::atof(argv[++i]);
    } else {
      settings += a + "\n";
    }
  }
  try {
    trainer::testing::DeviceSelect sel(settings, "probe-" + std::to_string(::getpid()));
    const auto out = sel.select();
    std::fputs(out.log.c_str(), stderr);
    if (out.exit_code != 0) {
      std::printf("error %d: %s\n", out.exit_code, out.error.c_str());
      return out.exit_code;
    }
    std::printf("selected %s\n", out.device.c_str());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(hold));
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 2;
  }
  return 0;
}
