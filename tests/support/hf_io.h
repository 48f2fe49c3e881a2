#pragma once
// The fixtures of tests/model/hf_models.py: io.pt of a model directory (a batch, transformers'
// logits, loss and gradients), read with LibTorch's pickle reader.
// For tests built with TRAINER_HF_PYTHON (the interpreter of the Hugging Face virtual environment).
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "trainer/memory.h"
#include "trainer/model.h"

namespace trainer::testing {

/// `file` (an io.pt): a dict of tensors.
inline std::map<std::string, at::Tensor> hf_io(const std::string& file) {
  const std::string bytes = read_file(file);
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict()) {
    out[kv.key().toStringRef()] = kv.value().toTensor();
  }
  return out;
}

/// [N, 3, L]: the batch's ids, attention mask and token types, as a text dataset gives them.
inline at::Tensor hf_tokens(const std::map<std::string, at::Tensor>& b) {
  return at::stack({b.at("input_ids"), b.at("attention_mask"), b.at("token_type_ids")}, 1);
}

/// The largest absolute difference of two tensors of one shape (in double).
inline double max_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

/// A run of one SGD step (lr 0.1, no momentum or weight decay) of model "bert" from `model_dir`
/// on the 8 samples of the registered dataset `dataset` in their order, on one thread, without
/// evaluation or console, with the task `task` where one is named: one step whose parameters
/// compare with transformers' gradients of the same batch.
class OneStepRun : public TrainerTest {
 protected:
  void TearDown() override { set_memory_limit(c10::Device(c10::kCPU), 0); }

  static std::string recipe(const std::string& model_dir, const std::string& dataset, const std::string& task = "") {
    return "[run]\nname = \"one_step\"\nseed = 1\n[model]\nname = \"bert\"\npath = \"" + model_dir +
           "\"\n[dataset]\nname = \"" + dataset + "\"\n" + (task.empty() ? "" : "[task]\nname = \"" + task + "\"\n") +
           "[training]\nepochs = 1\nbatch_size = 8\nshuffle = false\nlog_every = 1\n"
           "[optim]\nname = \"sgd\"\nlr = 0.1\nmomentum = 0.0\nweight_decay = 0.0\n"
           "[eval]\nevery_epochs = 0\nat_end = false\n[runtime]\nnum_threads = 1\n[metrics]\nconsole = false\n";
  }

  /// The parameters after the run of `recipe` named `name` (its one step expected), copied.
  std::map<std::string, at::Tensor> train(const std::string& recipe, const std::string& name,
                                          const std::vector<std::string>& overrides = {},
                                          const std::vector<std::shared_ptr<Plugin>>& extra = {},
                                          RunResult* result = nullptr, std::shared_ptr<Model>* model_out = nullptr) {
    std::shared_ptr<Model> model;
    const RunResult r = fit(recipe, overrides, name, extra, &model);
    EXPECT_EQ(r.exit_code, kExitOk) << r.message;
    EXPECT_EQ(r.global_step, 1);
    if (result) *result = r;
    if (model_out) *model_out = model;
    std::map<std::string, at::Tensor> out;
    if (model) {
      for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach().clone();
    }
    return out;
  }

  /// The logits transformers computes for io.pt's batch of `reference_dir` with the model it
  /// loads from `export_dir` (tests/model/hf_models.py check), which must print `says`.
  std::vector<double> transformers_logits(const std::string& export_dir, const std::string& reference_dir,
                                          const std::string& says) {
    const std::string out = tmp_ / "logits.txt";
    const auto check = run_command(std::string(TRAINER_HF_PYTHON) + " " + TRAINER_SOURCE_DIR +
                                   "/tests/model/hf_models.py check " + export_dir + " " + reference_dir + " " + out);
    EXPECT_EQ(check.code, 0) << check.text;
    EXPECT_NE(check.text.find(says), std::string::npos) << check.text;
    std::vector<double> logits;
    for (const auto& line : read_lines(out)) logits.push_back(std::stod(line));
    return logits;
  }
};

}  // namespace trainer::testing
