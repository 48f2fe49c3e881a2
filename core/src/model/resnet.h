#pragma once
// Private: the ResNet of the model registry ("resnet").
#include <cstdint>
#include <memory>
#include <string>

#include "trainer/model.h"
#include "trainer/settings.h"

namespace trainer {

/// [model] of "resnet". depth 18 and 34 use basic blocks, 50, 101 and 152 bottlenecks (with
/// the stride on the 3x3 convolution, torchvision's "ResNet v1.5").
struct ResnetSettings : Settings<ResnetSettings> {
  std::int64_t depth = 18;
  std::string stem = "imagenet";
  bool zero_init_residual = false;

  static void declare(SettingsSchema<ResnetSettings>& s) {
    s.add(&ResnetSettings::depth, "depth", "18, 34 (basic blocks), 50, 101 or 152 (bottlenecks)").min(18).max(152);
    s.add(&ResnetSettings::stem, "stem",
          "\"imagenet\": 7x7 stride-2 conv and 3x3 max-pool (torchvision's, for 224x224); \"small\": 3x3 "
          "stride-1 conv, no pool (for 28x28 or 32x32 images; conv1 then has another shape)")
        .choices({"imagenet", "small"});
    s.add(&ResnetSettings::zero_init_residual, "zero_init_residual",
          "Start each residual branch's last BatchNorm at zero (each block starts as the identity)");
  }
};

/// torchvision.models.ResNet: conv1, bn1, relu, maxpool, layer1..layer4 of residual blocks
/// (exposed by blocks()), global average pool, fc. Parameter and buffer names are torchvision's
/// (layerL.B.{conv1,bn1,conv2,bn2[,conv3,bn3],downsample.0,downsample.1}, fc), so its
/// state_dicts load name for name; initialisation as torchvision (Kaiming normal, fan_out).
/// Throws UsageError for a depth other than 18, 34, 50, 101, 152 or non-image samples.
std::shared_ptr<Model> make_resnet(const ResnetSettings& settings, const DataSpec& data);

}  // namespace trainer
