// What a weights file holds, read for load_weights and the Hugging Face models: safetensors,
// torch.save's zip format, or a trainer checkpoint.
#include "model/weights_file.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/serialize/input-archive.h>

#include "model/safetensors.h"
#include "model/script_archive.h"
#include "model/tensor_archive.h"
#include "model/torch_save.h"
#include "trainer/error.h"

namespace trainer::detail {

namespace {

using Tensors = std::map<std::string, at::Tensor>;

Tensors read_trainer_checkpoint(const std::string& setting, const std::string& file) {
  torch::serialize::InputArchive ar, model;
  try {
    ar = read_script_archive(file, at::kCPU);
  } catch (const ArchiveCodeError& e) {
    throw UsageError(fmt::format(
        "{} = \"{}\": a TorchScript archive that is not a trainer checkpoint: {}. trainer reads weights as data and "
        "runs no code from them; a model written in Python is model.name = \"torchscript\" with model.path, which "
        "runs its code: use that only for a file you trust",
        setting, file, e.what()));
  } catch (const TorchSaveError& e) {
    throw UsageError(fmt::format("{} = \"{}\": a damaged trainer checkpoint ({})", setting, file, e.what()));
  }
  TRAINER_CHECK_T(UsageError, ar.try_read("model", model), setting, " = \"", file,
                  "\": a TorchScript archive without a 'model' entry: not a trainer checkpoint (a Python "
                  "state_dict must be saved with torch.save(model.state_dict(), path))");
  c10::IValue base;
  TRAINER_CHECK_T(UsageError, !ar.try_read("frozen_base", base), setting, " = \"", file,
                  "\": a checkpoint of a run that trained part of its model (LoRA adapters, a probe's head): it holds "
                  "what trained, not the frozen weights (",
                  base.isString() ? base.toStringRef() : std::string("?"),
                  "). Resume that run with --resume, start from its adapters with plugins.lora.adapters = "
                  "\"<run>/lora_adapters.pt\" over the same model.weights, or write whole models with "
                  "plugins.lora.export_merged / plugins.linear_probe.export_model");
  Tensors out;
  read_nested(model, "", out);
  return out;
}

/// The dict of name -> tensor in what torch.save wrote: the object itself, or its "state_dict"
/// or "model" entry when it is a training checkpoint that wraps one.
Tensors read_state_dict(const std::string& setting, const std::string& file, const ZipArchive& zip) {
  PyRef v;
  try {
    v = read_torch_save(zip);
  } catch (const TorchSaveError& e) {
    throw UsageError(fmt::format("{} = \"{}\": {}; save the state_dict alone: torch.save(model.state_dict(), path)",
                                 setting, file, e.what()));
  }
  using Kind = PyValue::Kind;
  TRAINER_CHECK_T(UsageError, v->kind == Kind::Dict, setting, " = \"", file, "\" holds a ", v->type_name(),
                  ", not a state_dict (a dict of name -> tensor)");
  for (const char* wrapper : {"state_dict", "model"}) {
    for (const auto& [key, value] : v->entries) {
      if (key->kind == Kind::String && key->text == wrapper && value->kind == Kind::Dict) {
        v = value;
        break;
      }
    }
  }
  Tensors out;
  for (const auto& [key, value] : v->entries) {
    TRAINER_CHECK_T(UsageError, key->kind == Kind::String, setting, " = \"", file, "\": a state_dict key is a ",
                    key->type_name(), ", not a name");
    TRAINER_CHECK_T(UsageError, value->kind == Kind::Tensor, setting, " = \"", file, "\": '", key->text, "' is a ",
                    value->type_name(), ", not a tensor");
    // A dict Python wrote has each key once; a file that repeats one could show one tensor to
    // a reader that keeps the first and load another.
    TRAINER_CHECK_T(UsageError, out.emplace(key->text, value->tensor).second, setting, " = \"", file, "\": '",
                    key->text, "' is in the state_dict twice");
  }
  return out;
}

}  // namespace

WeightsFile::WeightsFile(const std::string& key, const std::string& file, bool checkpoints) : key_(key), file_(file) {
  if (SafeTensorsFile::sniff(file)) {
    try {
      safetensors_ = std::make_unique<SafeTensorsFile>(file);
    } catch (const SafeTensorsError& e) {
      throw UsageError(fmt::format("{} = \"{}\": a damaged safetensors file: {}", key, file, e.what()));
    }
    format_ = "safetensors";
    // Shapes and dtypes for the checks; the data is read by copy_into.
    for (const auto& [name, info] : safetensors_->tensors()) {
      tensors_[name] = at::empty(info.shape, at::TensorOptions(info.dtype).device(at::kMeta));
    }
    return;
  }
  // The file comes from anywhere: its zip structure is checked (every size against the file,
  // compressed entries capped, none overlapping) before LibTorch's reader or trainer's reads it.
  std::unique_ptr<ZipArchive> zip;
  try {
    zip = ZipArchive::open(file);
  } catch (const TorchSaveError& e) {
    throw UsageError(fmt::format("{} = \"{}\": {}; download or save it again (torch.save(model.state_dict(), path))",
                                 key, file, e.what()));
  }
  TRAINER_CHECK_T(UsageError, zip != nullptr, key, " = \"", file,
                  "\" is neither a safetensors file nor a zip archive (torch.save's format since PyTorch 1.6",
                  checkpoints ? ", or a trainer checkpoint" : "",
                  "); re-save it in Python with torch.save(model.state_dict(), path)");
  // A trainer checkpoint is a TorchScript archive (torch::serialize): it has constants.pkl,
  // torch.save's archives do not.
  const bool checkpoint = zip->has("constants.pkl");
  TRAINER_CHECK_T(UsageError, !checkpoint || checkpoints, key, " = \"", file,
                  "\" is a TorchScript archive (a trainer checkpoint?), not a state_dict saved with torch.save");
  format_ = checkpoint ? "trainer checkpoint" : "torch.save state_dict";
  tensors_ = checkpoint ? read_trainer_checkpoint(key, file) : read_state_dict(key, file, *zip);
}

WeightsFile::~WeightsFile() = default;

void WeightsFile::copy_into(const std::string& name, at::Tensor& dst) const {
  at::NoGradGuard no_grad;
  if (!safetensors_) {
    dst.copy_(tensors_.at(name));
    return;
  }
  try {
    safetensors_->read_into(name, dst);
  } catch (const SafeTensorsError& e) {
    throw UsageError(fmt::format("{} = \"{}\": {}", key_, file_, e.what()));
  }
}

}  // namespace trainer::detail
