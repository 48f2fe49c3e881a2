#include <algorithm>
#include <cctype>

#include "trainer/devices.h"

namespace trainer {

std::string DeviceSetting::str() const {
  switch (kind) {
    case Kind::Auto:
      return "auto";
    case Kind::Cpu:
      return "cpu";
    case Kind::Cuda:
      return "cuda:" + std::to_string(index);
  }
  return "?";
}

std::optional<DeviceSetting> parse_device_setting(const std::string& text, bool allow_auto) {
  if (text == "auto" && allow_auto) return DeviceSetting{DeviceSetting::Kind::Auto, -1};
  if (text == "cpu") return DeviceSetting{DeviceSetting::Kind::Cpu, -1};
  if (text == "cuda") return DeviceSetting{DeviceSetting::Kind::Cuda, 0};
  if (text.rfind("cuda:", 0) != 0) return std::nullopt;
  const std::string n = text.substr(5);
  const bool digits = !n.empty() && n.size() <= 4 &&
                      std::all_of(n.begin(), n.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
  if (!digits) return std::nullopt;
  return DeviceSetting{DeviceSetting::Kind::Cuda, std::stoi(n)};
}

KeyCheck device_setting_check(bool allow_auto) {
  return {allow_auto ? "auto, cpu, cuda or cuda:N" : "cpu, cuda or cuda:N",
          [allow_auto](const std::string& s) { return parse_device_setting(s, allow_auto).has_value(); }};
}

}  // namespace trainer
