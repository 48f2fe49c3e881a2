// Initial weights from a file the user already has: a state_dict saved in Python with
// torch.save (torchvision's names), a safetensors file (Hugging Face's), or a checkpoint
// trainer wrote.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fnmatch.h>
#include <torch/serialize/input-archive.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>

#include "model/safetensors.h"
#include "model/tensor_archive.h"
#include "model/torch_save.h"
#include "trainer/error.h"
#include "trainer/model.h"

namespace trainer {

namespace {

using Tensors = std::map<std::string, at::Tensor>;

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

bool excluded(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) {
    if (fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

Tensors read_trainer_checkpoint(const std::string& file) {
  torch::serialize::InputArchive ar, model;
  try {
    ar.load_from(file, at::kCPU);
  } catch (const c10::Error& e) {
    throw UsageError(
        fmt::format("model.weights = \"{}\": a damaged trainer checkpoint ({})", file, e.what_without_backtrace()));
  }
  TRAINER_CHECK_T(UsageError, ar.try_read("model", model), "model.weights = \"", file,
                  "\": a TorchScript archive without a 'model' entry: not a trainer checkpoint (a Python "
                  "state_dict must be saved with torch.save(model.state_dict(), path))");
  Tensors out;
  detail::read_nested(model, "", out);
  return out;
}

/// The dict of name -> tensor in what torch.save wrote: the object itself, or its "state_dict"
/// or "model" entry when it is a training checkpoint that wraps one.
Tensors read_state_dict(const std::string& file, const detail::ZipArchive& zip) {
  detail::PyRef v;
  try {
    v = detail::read_torch_save(zip);
  } catch (const detail::TorchSaveError& e) {
    throw UsageError(fmt::format(
        "model.weights = \"{}\": {}; save the state_dict alone: torch.save(model.state_dict(), path)", file, e.what()));
  }
  using Kind = detail::PyValue::Kind;
  TRAINER_CHECK_T(UsageError, v->kind == Kind::Dict, "model.weights = \"", file, "\" holds a ", v->type_name(),
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
    TRAINER_CHECK_T(UsageError, key->kind == Kind::String, "model.weights = \"", file, "\": a state_dict key is a ",
                    key->type_name(), ", not a name");
    TRAINER_CHECK_T(UsageError, value->kind == Kind::Tensor, "model.weights = \"", file, "\": '", key->text, "' is a ",
                    value->type_name(), ", not a tensor");
    // A dict Python wrote has each key once; a file that repeats one could show one tensor to
    // a reader that keeps the first and load another.
    TRAINER_CHECK_T(UsageError, out.emplace(key->text, value->tensor).second, "model.weights = \"", file, "\": '",
                    key->text, "' is in the state_dict twice");
  }
  return out;
}

}  // namespace

WeightsReport load_weights(Model& model, const std::string& file, const std::vector<std::string>& exclude) {
  TRAINER_CHECK_T(
      UsageError, std::filesystem::is_regular_file(file), "model.weights = \"", file,
      "\": no such file; torchvision's pretrained weights are saved as a state_dict once, where there is "
      "internet: python3 -c 'import torch, torchvision; torch.save(torchvision.models.resnet50(weights=\"DEFAULT\")"
      ".state_dict(), \"resnet50.pt\")' (vit_b_16, resnet18 alike; docs/transfer-learning.md)");
  WeightsReport report;
  // A safetensors file is read tensor by tensor straight into the model's: its entries stand
  // for the file's tensors in the checks below (shape and dtype, no data).
  std::unique_ptr<detail::SafeTensorsFile> safetensors;
  if (detail::SafeTensorsFile::sniff(file)) {
    try {
      safetensors = std::make_unique<detail::SafeTensorsFile>(file);
    } catch (const detail::SafeTensorsError& e) {
      throw UsageError(fmt::format("model.weights = \"{}\": a damaged safetensors file: {}", file, e.what()));
    }
  }
  // The file comes from anywhere: its zip structure is checked (every size against the file,
  // compressed entries capped, none overlapping) before LibTorch's reader or trainer's reads it.
  std::unique_ptr<detail::ZipArchive> zip;
  try {
    if (!safetensors) zip = detail::ZipArchive::open(file);
  } catch (const detail::TorchSaveError& e) {
    throw UsageError(
        fmt::format("model.weights = \"{}\": {}; download or save it again (torch.save(model.state_dict(), path))",
                    file, e.what()));
  }
  TRAINER_CHECK_T(UsageError, safetensors || zip != nullptr, "model.weights = \"", file,
                  "\" is neither a safetensors file nor a zip archive (torch.save's format since PyTorch 1.6, or a "
                  "trainer checkpoint); re-save it in Python with torch.save(model.state_dict(), path)");
  Tensors from;
  if (safetensors) {
    report.format = "safetensors";
    for (const auto& [name, info] : safetensors->tensors()) {
      from[name] = at::empty(info.shape, at::TensorOptions(info.dtype).device(at::kMeta));
    }
  } else {
    // A trainer checkpoint is a TorchScript archive (torch::serialize): it has constants.pkl,
    // torch.save's archives do not.
    const bool checkpoint = zip->has("constants.pkl");
    report.format = checkpoint ? "trainer checkpoint" : "torch.save state_dict";
    from = checkpoint ? read_trainer_checkpoint(file) : read_state_dict(file, *zip);
    zip.reset();
  }

  Tensors into;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) into[p.key()] = p.value();
  for (const auto& b : model.named_buffers(/*recurse=*/true)) into[b.key()] = b.value();

  // nn.DataParallel / DistributedDataParallel save every name under "module."; dropped when
  // the model's own names do not start so.
  const auto prefixed = [](const Tensors& t) {
    return !t.empty() &&
           std::all_of(t.begin(), t.end(), [](const auto& kv) { return kv.first.rfind("module.", 0) == 0; });
  };
  if (prefixed(from) && !prefixed(into)) {
    Tensors stripped;
    for (auto& [k, t] : from) stripped[k.substr(7)] = t;
    from = std::move(stripped);
  }
  // A pattern that matches nothing is a typo that would load what was meant to stay fresh.
  for (const auto& pattern : exclude) {
    const auto matches = [&](const Tensors& t) {
      return std::any_of(t.begin(), t.end(), [&](const auto& kv) { return excluded(kv.first, {pattern}); });
    };
    TRAINER_CHECK_T(UsageError, matches(into) || matches(from), "model.weights_exclude: '", pattern,
                    "' matches no tensor of the model or of ", file);
  }

  std::vector<std::string> missing, unexpected, misshaped;
  for (const auto& [name, t] : into) {
    if (excluded(name, exclude)) {
      report.excluded.push_back(name);
      continue;
    }
    auto it = from.find(name);
    static const std::string kCounter = ".num_batches_tracked";
    const bool counter =
        name.size() >= kCounter.size() && name.compare(name.size() - kCounter.size(), kCounter.size(), kCounter) == 0;
    if (it == from.end()) {
      // BatchNorm's counter is absent from files of PyTorch < 0.4.1 (torchvision's older
      // weights); PyTorch then keeps the module's own, as here.
      if (!counter) missing.push_back(name);
    } else if (it->second.sizes() != t.sizes()) {
      misshaped.push_back(name + " (file " + shape_of(it->second) + ", model " + shape_of(t) + ")");
    } else if (c10::isComplexType(it->second.scalar_type()) != c10::isComplexType(t.scalar_type()) ||
               c10::isFloatingType(it->second.scalar_type()) != c10::isFloatingType(t.scalar_type())) {
      misshaped.push_back(name + " (file " + std::string(c10::toString(it->second.scalar_type())) + ", model " +
                          c10::toString(t.scalar_type()) + ")");
    }
  }
  for (const auto& [name, t] : from) {
    if (!into.count(name) && !excluded(name, exclude)) unexpected.push_back(name);
  }
  if (!missing.empty() || !unexpected.empty() || !misshaped.empty()) {
    std::ostringstream os;
    os << "model.weights = \"" << file << "\" (" << report.format << ") does not fit the model:";
    if (!misshaped.empty()) {
      os << " " << misshaped.size() << " mis-shaped or mis-typed, the first " << misshaped.front() << ";";
    }
    if (!missing.empty())
      os << " " << missing.size() << " missing from the file, the first '" << missing.front() << "';";
    if (!unexpected.empty()) {
      os << " " << unexpected.size() << " not in the model, the first '" << unexpected.front() << "';";
    }
    os << " names are torchvision's (docs/transfer-learning.md); model.weights_exclude = [\"fc.*\"] (or "
          "[\"heads.*\"] for the ViT) keeps a new head at its initial values";
    throw UsageError(os.str());
  }
  at::NoGradGuard no_grad;
  for (auto& [name, t] : into) {
    const auto it = from.find(name);
    if (excluded(name, exclude) || it == from.end()) continue;
    if (safetensors) {
      try {
        safetensors->read_into(name, t);  // converts dtype and device, a chunk at a time
      } catch (const detail::SafeTensorsError& e) {
        throw UsageError(fmt::format("model.weights = \"{}\": {}", file, e.what()));
      }
    } else {
      t.copy_(it->second);  // converts dtype and device
    }
    ++report.loaded;
  }
  return report;
}

}  // namespace trainer
