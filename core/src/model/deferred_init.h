#pragma once
// Weights a file is about to overwrite need no random initialisation: drawing BERT-base's 110 M
// random numbers took most of its load (about 1.7 s of 1.9 s on 2 cores, and longer in bf16).
// Nor do they need to be made on the host first: a model read from a directory is built on the
// run's device and its file read into it there; a safetensors file a chunk at a time, so that
// neither the host nor the device ever holds a second copy (a pytorch_model.bin is read whole
// on the host by the torch.save reader).
#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>

namespace trainer::detail {

/// While one is alive on this thread, trainer::Linear, trainer::Conv2d and model "bert"'s layers
/// leave the weights they create uninitialised, and create them on `device`; whoever holds it
/// loads every weight or initialises those the file lacks.
class DeferInit {
 public:
  explicit DeferInit(c10::Device device = c10::Device(c10::kCPU));
  ~DeferInit();
  DeferInit(const DeferInit&) = delete;
  DeferInit& operator=(const DeferInit&) = delete;
  static bool active();
  /// What the layers create their weights with: the default dtype, on the device of the
  /// DeferInit alive (the CPU without one).
  static c10::TensorOptions options();

 private:
  bool before_;
  c10::Device device_before_;
};

/// The device a model that reads its weights from a file itself (model "bert" with
/// `model.path`) builds them on: the run's, while one is alive on this thread (the core holds
/// one around building the model); the CPU without one.
class LoadOnto {
 public:
  explicit LoadOnto(c10::Device device);
  ~LoadOnto();
  LoadOnto(const LoadOnto&) = delete;
  LoadOnto& operator=(const LoadOnto&) = delete;
  static c10::Device device();

 private:
  c10::Device before_;
};

}  // namespace trainer::detail
