// Initial weights from a file the user already has: a state_dict saved in Python with
// torch.save (torchvision's names), a safetensors file (Hugging Face's), or a checkpoint
// trainer wrote.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fnmatch.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include "model/weights_file.h"
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

}  // namespace

WeightsReport load_weights(Model& model, const std::string& file, const std::vector<std::string>& exclude) {
  TRAINER_CHECK_T(
      UsageError, std::filesystem::is_regular_file(file), "model.weights = \"", file,
      "\": no such file; torchvision's pretrained weights are saved as a state_dict once, where there is "
      "internet: python3 -c 'import torch, torchvision; torch.save(torchvision.models.resnet50(weights=\"DEFAULT\")"
      ".state_dict(), \"resnet50.pt\")' (vit_b_16, resnet18 alike; docs/transfer-learning.md)");
  WeightsReport report;
  const detail::WeightsFile weights("model.weights", file);
  report.format = weights.format();
  Tensors from = weights.tensors();  // the same tensors (or a safetensors file's shapes), renamed below

  Tensors into;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) into[p.key()] = p.value();
  for (const auto& b : model.named_buffers(/*recurse=*/true)) into[b.key()] = b.value();

  // nn.DataParallel / DistributedDataParallel save every name under "module."; dropped when
  // the model's own names do not start so.
  const auto prefixed = [](const Tensors& t) {
    return !t.empty() &&
           std::all_of(t.begin(), t.end(), [](const auto& kv) { return kv.first.rfind("module.", 0) == 0; });
  };
  const bool strip = prefixed(from) && !prefixed(into);
  if (strip) {
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
    weights.copy_into(strip ? "module." + name : name, t);  // converts dtype and device
    ++report.loaded;
  }
  return report;
}

}  // namespace trainer
