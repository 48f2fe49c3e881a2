#pragma once
// Private: the Vision Transformer of the model registry ("vit").
#include <cstdint>
#include <memory>

#include "trainer/model.h"
#include "trainer/settings.h"

namespace trainer {

/// [model] of "vit". The defaults are a tiny ViT for 28x28 images (16 patches of 7x7); the
/// torchvision sizes are config groups (configs/model/vit_b_16.toml: patch 16, 768 wide,
/// 12 layers of 12 heads, MLP 3072).
struct VitSettings : Settings<VitSettings> {
  std::int64_t patch_size = 7;
  std::int64_t hidden_dim = 64;
  std::int64_t num_layers = 4;
  std::int64_t num_heads = 4;
  std::int64_t mlp_dim = 128;
  double dropout = 0.0;
  double attention_dropout = 0.0;

  static void declare(SettingsSchema<VitSettings>& s) {
    s.add(&VitSettings::patch_size, "patch_size",
          "Side of the square patches; must divide the image's height and width")
        .min(1);
    s.add(&VitSettings::hidden_dim, "hidden_dim", "Token width (a multiple of num_heads)").min(1);
    s.add(&VitSettings::num_layers, "num_layers", "Encoder layers (the blocks activation checkpointing wraps)").min(1);
    s.add(&VitSettings::num_heads, "num_heads", "Attention heads per layer").min(1);
    s.add(&VitSettings::mlp_dim, "mlp_dim", "Hidden width of each layer's MLP").min(1);
    s.add(&VitSettings::dropout, "dropout", "Dropout after the position embedding, the attention and in the MLP")
        .min(0)
        .max(1, false);
    s.add(&VitSettings::attention_dropout, "attention_dropout", "Dropout on the attention weights")
        .min(0)
        .max(1, false);
  }
};

/// Patch embedding (a conv of kernel and stride patch_size), class token, learned position
/// embedding, num_layers pre-norm encoder blocks (multi-head self-attention and MLP, exposed by
/// blocks()), final LayerNorm, linear head on the class token. Parameter names are torchvision's
/// (conv_proj, class_token, encoder.pos_embedding, encoder.layers.encoder_layer_N.{ln_1,
/// self_attention.{in_proj_weight,in_proj_bias,out_proj}, ln_2, mlp.0, mlp.3}, encoder.ln,
/// heads.head). Throws UsageError when patch_size does not divide the image or hidden_dim is
/// not a multiple of num_heads.
std::shared_ptr<Model> make_vit(const VitSettings& settings, const DataSpec& data);

}  // namespace trainer
