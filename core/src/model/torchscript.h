#pragma once
// Private: model "torchscript", a module written in Python and saved with torch.jit.script
// (or torch.jit.trace) and .save(), trained as it is. The heavy TorchScript headers stay in
// torchscript.cpp.
#include <memory>
#include <string>
#include <vector>

#include "trainer/model.h"
#include "trainer/settings.h"
#include "trainer/task.h"

namespace trainer {

/// [model] of "torchscript".
struct TorchScriptSettings : Settings<TorchScriptSettings> {
  std::string path;
  std::vector<std::string> freeze;

  static void declare(SettingsSchema<TorchScriptSettings>& s) {
    s.add(&TorchScriptSettings::path, "path",
          "The module's file, as torch.jit.script(module).save(path) writes it in Python; forward takes one "
          "batch tensor and returns the task's outputs [N, K] (classification: the logits)")
        .required();
    s.add(&TorchScriptSettings::freeze, "freeze",
          "Name patterns (* wildcards, state_dict names) of parameters left untrained, e.g. [\"backbone.*\"]");
  }
};

/// Loads `section.path` as model "torchscript" for `data`: checks the file (a TorchScript
/// archive), forward's signature (one tensor in, one tensor out) and one forward of a sample of
/// the data's shape (the task's outputs [1, data.num_classes]), and converts its floating-point tensors to
/// model.dtype. Throws UsageError naming model.path, the file and what is allowed.
std::shared_ptr<Model> load_torchscript_model(const Config& section, const DataSpec& data);

/// Loads `file` (the value of the key `key`, e.g. "task.loss_path") as a loss scripted in
/// Python: a module or function whose forward takes the model's outputs and the targets and
/// returns each sample's loss [N]. Checks the file, forward's signature and that the loss has no
/// parameters (nothing would train them); each call checks what it returns (floating point
/// [N], with a gradient when the outputs have one). Throws UsageError naming the key and file.
SampleLoss load_torchscript_loss(const std::string& key, const std::string& file);

/// When `model` is a TorchScript model: writes its module with its current weights to `path`
/// (durably, through a temporary file), readable by Python's torch.jit.load, and returns true.
/// Otherwise writes nothing and returns false.
bool save_torchscript_module(Model& model, const std::string& path);

/// Whether `model` is a TorchScript model (its layers are compiled into the module's forward).
bool is_torchscript_model(const Model& model);

/// The file a run directory holds its TorchScript model's module in (see save_torchscript_module).
inline constexpr const char* kTorchScriptModuleFile = "torchscript_model.pt";

}  // namespace trainer
