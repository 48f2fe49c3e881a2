// Masked language modelling with model "bert": the masked-LM heads transformers writes
// (BertForMaskedLM, RobertaForMaskedLM, BertForPreTraining's; tests/model/hf_models.py) load
// name for name and give transformers' logits, loss and gradients through the task "masked_lm";
// a run's step is transformers' step however the batch is split into micro-batches (the loss
// is the mean over the batch's masked tokens, not over samples); the run's export loads into
// transformers' AutoModelForMaskedLM; an encoder pre-trained this way is the start of a
// classifier.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "support/forward_squeeze.h"
#include "support/hf_io.h"
#include "support/test_util.h"
#include "trainer/data.h"
#include "trainer/error.h"
#include "trainer/memory.h"
#include "trainer/model.h"
#include "trainer/task.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::hf_tokens;
using testing::max_diff;

const std::string kMlmModels = TRAINER_HF_MODELS;

std::map<std::string, at::Tensor> mlm_io(const std::string& dir) {
  return testing::hf_io(kMlmModels + "/" + dir + "/io.pt");
}

/// The spec a run builds a masked-LM model with: 1000 token ids, logits per token.
DataSpec mlm_spec(std::int64_t pad) {
  DataSpec d{{3, 12}, 1000, 1000, pad};
  d.token_outputs = true;
  return d;
}

std::shared_ptr<Model> model_of(const std::string& dir, const DataSpec& spec) {
  torch::manual_seed(7);
  return build_model(Config::parse("name = \"bert\"\npath = \"" + kMlmModels + "/" + dir + "\"\n"), spec);
}

std::unique_ptr<Task> masked_lm(const std::map<std::string, at::Tensor>& b, std::int64_t pad) {
  const Batch probe{hf_tokens(b), b.at("labels")};
  return task_registry().get("masked_lm").factory(Config(), DataSpec{{3, 12}, 0, 1000, pad}, probe);
}

class MaskedLmFromTransformers : public ::testing::TestWithParam<const char*> {};

// The logits per token [4, 12, 1000] within 1e-5 (as the classifier's, tests/model/bert_test.cpp:
// float32 rounding of 64-wide sums is ~1e-7; a tensor in the wrong place, or a head tensor left
// at its initial value, moves them by 1e-2: the fixture's biases and LayerNorms are not);
// the task's loss is transformers' (the mean over the 9 masked tokens) within 1e-6, and each
// gradient within 1e-5 of its own largest value. The decoder is the word embeddings: one
// tensor, whose gradient sums the embedding's and the decoder's, as transformers' tied one.
TEST_P(MaskedLmFromTransformers, SameLogitsLossAndGradients) {
  const std::string dir = GetParam();
  const std::int64_t pad = dir == std::string("bert_mlm") ? 0 : 1;
  auto m = model_of(dir, mlm_spec(pad));
  auto b = mlm_io(dir);
  const at::Tensor x = hf_tokens(b);
  m->eval();
  {
    torch::NoGradGuard no_grad;
    EXPECT_LE(max_diff(m->forward(x), b.at("logits")), 1e-5);
  }
  EXPECT_EQ(m->head_name(), "");  // no linear head: the decoder is the embeddings
  const auto task = masked_lm(b, pad);
  EXPECT_TRUE(task->token_outputs());
  EXPECT_EQ(task->outputs(), 1000);
  m->train();
  const at::Tensor loss = task->mean_loss(m->forward(x), b.at("labels"));
  EXPECT_NEAR(loss.item<double>(), b.at("loss").item<double>(), 1e-6);
  loss.backward();
  int compared = 0;
  for (const auto& p : m->named_parameters()) {
    const at::Tensor& want = b.at("grad." + p.key());
    EXPECT_LE(max_diff(p.value().grad(), want), 1e-5 * want.abs().max().item<double>() + 1e-9) << p.key();
    ++compared;
  }
  // 5 embeddings and 16 per layer, the head's dense (2), LayerNorm (2) and bias; no pooler.
  EXPECT_EQ(compared, 5 + 2 * 16 + 5);
  // The weights: the sample weights are the masked tokens per row (3, 2, 3, 1 in hf_models.py).
  EXPECT_TRUE(task->sample_weights(b.at("labels")).equal(at::tensor({3, 2, 3, 1}, at::kLong)));
}

INSTANTIATE_TEST_SUITE_P(Directories, MaskedLmFromTransformers, ::testing::Values("bert_mlm", "roberta_mlm"));

// The task's pieces on one batch: each sample's loss is the mean over its masked tokens; the
// batch's (mean_loss) the mean over all of them, the samples' losses weighted by their masked
// tokens; train_sums counts the masked tokens predicted right and the masked tokens; the
// evaluation's loss is token-weighted and its perplexity exp(loss). Padding the model did not
// compute (outputs narrower than the targets) is cut from the targets.
TEST(MaskedLmTask, LossesAreMeansOverMaskedTokens) {
  auto b = mlm_io("bert_mlm");
  const auto task = masked_lm(b, 0);
  auto m = model_of("bert_mlm", mlm_spec(0));
  m->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor out = m->forward(hf_tokens(b)), y = b.at("labels");
  const at::Tensor per_sample = task->sample_losses(out, y);
  const at::Tensor w = task->sample_weights(y).to(at::kDouble);
  EXPECT_NEAR(task->mean_loss(out, y).item<double>(),
              (per_sample.to(at::kDouble) * w).sum().item<double>() / w.sum().item<double>(), 1e-6);
  const at::Tensor sums = task->train_sums(out, y);
  EXPECT_EQ(sums[1].item<std::int64_t>(), 9);
  const at::Tensor rows = task->eval_rows(out, y);
  ASSERT_EQ(rows.sizes(), (std::vector<std::int64_t>{4, 3}));
  const auto metrics = task->evaluate(rows);
  EXPECT_NEAR(metrics.at("loss"), task->mean_loss(out, y).item<double>(), 1e-6);
  EXPECT_NEAR(metrics.at("perplexity"), std::exp(metrics.at("loss")), 1e-9);
  EXPECT_DOUBLE_EQ(metrics.at("masked_tokens"), 9);
  EXPECT_DOUBLE_EQ(metrics.at("accuracy"), sums[0].item<double>() / 9);
  // Outputs computed over 12 columns for targets padded to 20: the same loss.
  const at::Tensor wider = at::cat({y, at::full({4, 8}, -100, at::kLong)}, 1);
  EXPECT_NEAR(task->mean_loss(out, wider).item<double>(), task->mean_loss(out, y).item<double>(), 1e-7);
  // A masked token beyond what the model computed is an error, not a token dropped.
  at::Tensor hidden_beyond = wider.clone();
  hidden_beyond[0][15] = 7;
  EXPECT_THROW(task->mean_loss(out, hidden_beyond), UsageError);
  // A micro-batch without masked tokens: loss 0, not 0/0.
  const at::Tensor none = at::full({4, 12}, -100, at::kLong);
  EXPECT_EQ(task->mean_loss(out, none).item<double>(), 0.0);
  EXPECT_TRUE(task->sample_losses(out, none).eq(0).all().item<bool>());
}

// A pre-training checkpoint (BertForPreTraining): its masked-LM head loads into the masked-LM
// model (the next-sentence head and the pooler are left out) and gives its prediction logits;
// a masked-LM checkpoint loads into a classifier (encoder taken, pooler and classifier new).
TEST(MaskedLmTask, PretrainingAndMaskedLmCheckpointsLoadEitherWay) {
  auto b = mlm_io("bert_pretraining");
  auto mlm = model_of("bert_pretraining", mlm_spec(0));
  mlm->eval();
  torch::NoGradGuard no_grad;
  EXPECT_LE(max_diff(mlm->forward(hf_tokens(b)), b.at("mlm_logits")), 1e-5);
  auto classifier = model_of("bert_mlm", DataSpec{{3, 12}, 5, 1000, 0});
  EXPECT_EQ(classifier->forward(hf_tokens(b)).sizes(), (std::vector<std::int64_t>{4, 5}));
  std::map<std::string, at::Tensor> c, m;
  for (const auto& p : classifier->named_parameters()) c[p.key()] = p.value();
  auto source = model_of("bert_mlm", mlm_spec(0));
  for (const auto& p : source->named_parameters()) m[p.key()] = p.value();
  EXPECT_TRUE(c.at("bert.encoder.layer.1.output.dense.weight").equal(m.at("bert.encoder.layer.1.output.dense.weight")));
  EXPECT_TRUE(c.count("bert.pooler.dense.weight"));
  EXPECT_FALSE(m.count("bert.pooler.dense.weight"));
  // A classifier's directory into the masked-LM model: the head the file lacks is initialised
  // as transformers does (the model is built without initialising what the file loads).
  auto fresh = model_of("bert", mlm_spec(0));
  std::map<std::string, at::Tensor> f;
  for (const auto& p : fresh->named_parameters()) f[p.key()] = p.value();
  EXPECT_TRUE(f.at("cls.predictions.transform.LayerNorm.weight").eq(1).all().item<bool>());
  EXPECT_TRUE(f.at("cls.predictions.transform.LayerNorm.bias").eq(0).all().item<bool>());
  EXPECT_TRUE(f.at("cls.predictions.transform.dense.bias").eq(0).all().item<bool>());
  EXPECT_TRUE(f.at("cls.predictions.bias").eq(0).all().item<bool>());
  const at::Tensor dense = f.at("cls.predictions.transform.dense.weight");
  EXPECT_TRUE(dense.isfinite().all().item<bool>());
  EXPECT_NEAR(dense.std().item<double>(), 0.02, 0.2 * 0.02) << dense.numel() << " values";
}

// Refusals naming what is wrong: the task on class labels, a task asking for more logits per
// token than the vocabulary has.
TEST(MaskedLmTask, DataThatIsNotMaskedIsRefused) {
  auto b = mlm_io("bert");
  const Batch probe{hf_tokens(b), b.at("labels")};
  try {
    task_registry().get("masked_lm").factory(Config(), DataSpec{{3, 12}, 3, 1000, 0}, probe);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("dataset.masked_lm = true"), std::string::npos) << e.what();
  }
  DataSpec more = mlm_spec(0);
  more.num_classes = 1001;
  try {
    model_of("bert_mlm", more);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("wants 1001 logits per token"), std::string::npos) << e.what();
  }
}

/// io.pt's batch of a masked-LM directory, twice: 8 samples of [3, 12] tokens and their
/// masked-LM labels [12], its rows in the order 0, 2, 0, 2, 1, 3, 1, 3 (3, 3, 3, 3, 2, 1, 2, 1
/// masked tokens). A stand-in for a text dataset with dataset.masked_lm.
class IoMasked final : public Dataset {
 public:
  IoMasked() {
    auto b = mlm_io("bert_mlm");
    const at::Tensor rows = at::tensor({0, 2, 0, 2, 1, 3, 1, 3}, at::kLong);
    inputs_ = hf_tokens(b).index_select(0, rows);
    targets_ = b.at("labels").index_select(0, rows);
  }
  std::int64_t size() const override { return inputs_.size(0); }
  Batch get(const at::Tensor& idx) const override {
    return {inputs_.index_select(0, idx), targets_.index_select(0, idx)};
  }
  DataSpec spec() const override { return {{3, 12}, 0, 1000, 0}; }

 private:
  at::Tensor inputs_, targets_;
};

class MaskedLmTraining : public testing::OneStepRun {
 protected:
  static void SetUpTestSuite() {
    dataset_registry().add("bert_io_masked", [](const Config&, Split) -> std::shared_ptr<Dataset> {
      return std::make_shared<IoMasked>();
    });
  }
  static std::string mlm_recipe() { return recipe(kMlmModels + "/bert_mlm", "bert_io_masked", "masked_lm"); }
  std::map<std::string, at::Tensor> train(const std::string& name, const std::vector<std::string>& overrides = {},
                                          const std::vector<std::shared_ptr<Plugin>>& extra = {}) {
    return OneStepRun::train(mlm_recipe(), name, overrides, extra);
  }
};

// One SGD step on the 8 samples (io's batch twice: the same mean over masked tokens) moves each
// parameter by lr times transformers' gradient, within float32 rounding (as in bert_test.cpp).
// Split into micro-batches of 3 (3 + 3 + 2 samples holding 9, 6 and 3 masked tokens), and
// retried in two micro-batches of 4 (12 and 6 masked tokens) after an out-of-memory error in
// the first forward, the step is the same to the rounding of a gradient summed in parts
// (1e-6): each micro-batch counts by its masked tokens. Weighing micro-batches by their samples
// instead counts each token of the three micro-batches of 3 by 1/24, 1/16 and 1/12 instead of
// 1/18 (of the retry's two halves by 1/24 and 1/12).
TEST_F(MaskedLmTraining, TheStepIsTransformersStepHoweverTheBatchIsSplit) {
  const auto whole = train("whole");
  ASSERT_FALSE(whole.empty());
  auto initial = model_of("bert_mlm", mlm_spec(0));
  auto b = mlm_io("bert_mlm");
  for (const auto& p : initial->named_parameters()) {
    const at::Tensor grad = b.at("grad." + p.key());
    const double weights = p.value().abs().max().item<double>();
    EXPECT_LE(max_diff(whole.at(p.key()) - p.value().detach(), -0.1 * grad),
              0.1 * 1e-5 * grad.abs().max().item<double>() + 2 * 1.2e-7 * weights + 1e-9)
        << p.key();
  }
  const auto split = train("split", {"training.micro_batch_size=3"});
  auto squeeze = std::make_shared<testing::Squeeze>(std::set<std::int64_t>{0}, 64 << 10);
  const auto squeezed = train("squeezed", {}, {squeeze});
  EXPECT_EQ(squeeze->ooms, 1);
  for (const auto& [name, t] : whole) {
    EXPECT_LE(max_diff(split.at(name), t), 1e-6) << name;
    EXPECT_LE(max_diff(squeezed.at(name), t), 1e-6) << name;
  }
}

// What a run leaves: <run>/hf_model with config.json (BertForMaskedLM) and model.safetensors
// (no decoder: it is the embeddings), which transformers' AutoModelForMaskedLM loads giving the
// trained model's logits within 1e-5.
TEST_F(MaskedLmTraining, TheRunLeavesADirectoryAutoModelForMaskedLmLoads) {
  RunResult r;
  std::shared_ptr<Model> model;
  OneStepRun::train(mlm_recipe(), "export", {}, {}, &r, &model);
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  const std::string dir = r.run_dir + "/hf_model";
  EXPECT_NE(testing::read_file(dir + "/config.json").find("\"BertForMaskedLM\""), std::string::npos);
  const auto python =
      transformers_logits(dir, kMlmModels + "/bert_mlm", "hf_models check: BertForMaskedLM (4, 12, 1000)");
  ASSERT_EQ(python.size(), 4u * 12 * 1000);
  auto b = mlm_io("bert_mlm");
  model->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor mine = model->forward(hf_tokens(b));
  EXPECT_LE(max_diff(mine, at::tensor(python, at::kDouble).view({4, 12, 1000})), 1e-5);
  EXPECT_GT(max_diff(mine, b.at("logits")), 1e-4);  // trained, not the initial model
}

}  // namespace
}  // namespace trainer
