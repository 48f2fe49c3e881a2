#pragma once
// Private: the tensors of a weights file by name, for reading into a model's: a safetensors
// file (each read straight into its destination, a chunk at a time), a state_dict that Python's
// torch.save wrote (read whole by trainer's reader, which executes nothing), or a trainer
// checkpoint's model. Told apart by their content.
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>

namespace trainer::detail {

class SafeTensorsFile;

class WeightsFile {
 public:
  /// Opens `file`, named by the key `key` ("model.weights", "model.path"), and checks it.
  /// `checkpoints`: whether a trainer checkpoint is accepted. Throws UsageError starting
  /// `key = "file": ` and saying what is wrong and what to do.
  WeightsFile(const std::string& key, const std::string& file, bool checkpoints = true);
  ~WeightsFile();
  WeightsFile(const WeightsFile&) = delete;
  WeightsFile& operator=(const WeightsFile&) = delete;

  /// "safetensors", "torch.save state_dict" or "trainer checkpoint".
  const std::string& format() const { return format_; }
  /// Every tensor by name: with its data, or, for a safetensors file, its shape and dtype only
  /// (meta tensors; copy_into reads the data).
  const std::map<std::string, at::Tensor>& tensors() const { return tensors_; }
  /// Tensor `name` into `dst` (its shape; a floating dtype for a floating one, an integer for an
  /// integer; any device), converted on the way.
  void copy_into(const std::string& name, at::Tensor& dst) const;

 private:
  std::string key_, file_, format_;
  std::map<std::string, at::Tensor> tensors_;
  std::unique_ptr<SafeTensorsFile> safetensors_;
};

}  // namespace trainer::detail
