#pragma once
// What the tests of TorchScript models and losses share: the fixture files Python writes
// (tests/model/torchscript_models.py), the recipe of its reference loop, and a plugin that makes
// chosen steps run out of memory.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/forward_squeeze.h"
#include "support/test_util.h"
#include "trainer/memory.h"
#include "trainer/model.h"
#include "trainer/trainer.h"

namespace trainer::ts_test {

using testing::Squeeze;

using testing::read_lines;

inline const c10::Device kCpu(c10::kCPU);

inline std::string fixture(const std::string& name) { return std::string(TRAINER_TORCHSCRIPT_FIXTURES) + "/" + name; }

/// The settings of the Python reference loop (torchscript_models.py): the first 256
/// Fashion-MNIST images in order, batches of 32, SGD with momentum, one thread (the kernels
/// then sum in the order Python's do).
inline constexpr const char* kRecipe = R"(
[run]
name = "ts"
seed = 1
[model]
name = "torchscript"
path = "FILE"
[dataset]
name = "fashion_mnist"
limit = 256
eval_limit = 64
[training]
epochs = 1
batch_size = 32
shuffle = false
log_every = 1
[optim]
name = "sgd"
lr = 0.02
momentum = 0.9
[eval]
every_epochs = 0
at_end = false
[runtime]
num_threads = 1
[metrics]
console = false
)";

inline std::string recipe_for(const std::string& file) {
  std::string r = kRecipe;
  r.replace(r.find("FILE"), 4, file);
  return r;
}

using Tensors = std::map<std::string, at::Tensor>;

inline Tensors state_of(torch::nn::Module& m) {
  Tensors out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value().detach().clone();
  return out;
}

/// The model "torchscript" of `file` as a run builds it, with the [model] keys `more`, for data of
/// one 28x28 channel and 10 classes.
inline std::shared_ptr<Model> load(const std::string& file, const std::string& more = "") {
  const Config c = Config::parse("[model]\nname = \"torchscript\"\npath = \"" + file + "\"\n" + more);
  return build_model(c.sub("model"), DataSpec{{1, 28, 28}, 10});
}

class TorchScript : public testing::TrainerTest {
 protected:
  void TearDown() override { set_memory_limit(kCpu, 0); }
  /// Trains model "torchscript" of `file` with the reference loop's recipe; trained_ is then its
  /// parameters and buffers.
  RunResult run(const std::string& file, const std::string& name, const std::vector<std::string>& overrides = {},
                std::vector<std::shared_ptr<Plugin>> extra = {}) {
    return run_recipe(recipe_for(file), name, overrides, std::move(extra));
  }
  RunResult run_recipe(const std::string& recipe, const std::string& name,
                       const std::vector<std::string>& overrides = {},
                       std::vector<std::shared_ptr<Plugin>> extra = {}) {
    Trainer t(options_for(recipe, overrides, name, std::move(extra)));
    RunResult r = t.fit();
    trained_ = t.model() ? state_of(*t.model()) : Tensors{};
    return r;
  }
  Tensors trained_;
};

inline std::vector<double> numbers_in(const std::string& path) {
  std::vector<double> out;
  for (const auto& line : read_lines(path)) out.push_back(std::stod(line));
  return out;
}

}  // namespace trainer::ts_test
