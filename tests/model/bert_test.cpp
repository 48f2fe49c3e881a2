// Model "bert": model directories that Hugging Face's transformers writes with save_pretrained
// (tests/model/hf_models.py, in the venv of tests/hf/hf_venv.sh) load name for name and give
// transformers' logits and gradients; a pre-training checkpoint gives its encoder; a batch
// padded longer computes the same; directories that do not fit are refused with exit-2 errors
// naming the file and what is allowed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "support/forward_squeeze.h"
#include "support/hf_io.h"
#include "support/test_util.h"
#include "trainer/data.h"
#include "trainer/error.h"
#include "trainer/lora.h"
#include "trainer/memory.h"
#include "trainer/model.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::read_file;

const std::string kDir = TRAINER_HF_MODELS;

/// io.pt of a model directory: a dict of tensors.
std::map<std::string, at::Tensor> io(const std::string& dir) { return testing::hf_io(kDir + "/" + dir + "/io.pt"); }

std::shared_ptr<Model> bert(const std::string& dir, std::int64_t labels = 3, const std::string& more = "") {
  torch::manual_seed(7);
  return build_model(Config::parse("name = \"bert\"\npath = \"" + kDir + "/" + dir + "\"\n" + more),
                     DataSpec{{3, 12}, labels});
}

using testing::hf_tokens;
using testing::max_diff;
at::Tensor tokens(std::map<std::string, at::Tensor>& b) { return hf_tokens(b); }

/// The UsageError message of building `toml`'s model, "" when it builds.
std::string refusal(const std::string& toml, const DataSpec& data = DataSpec{{3, 12}, 3}) {
  try {
    build_model(Config::parse(toml), data);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

class FromTransformers : public ::testing::TestWithParam<const char*> {};

// The same weights and the same operations in the same order: the logits agree to float32
// rounding (1e-5 on logits of ~0.1-1: matmuls of 64-wide rows summed in another order by
// another build's kernels are ~1e-7 apart; a tensor loaded into the wrong place or a mask
// misapplied moves them by 1e-2 or more). The gradients of a training step (dropout 0) too,
// each within 1e-5 of its own largest value (the keys' biases, whose gradient is 0 in exact
// arithmetic, within 1e-9).
TEST_P(FromTransformers, SameLogitsAndGradientsAsTransformers) {
  const std::string dir = GetParam();
  auto m = bert(dir);
  auto b = io(dir);
  const at::Tensor x = tokens(b);
  m->eval();
  {
    torch::NoGradGuard no_grad;
    EXPECT_LE(max_diff(m->forward(x), b.at("logits")), 1e-5);
    // Without token types ([N, 2, L]) they are zeros; the RoBERTa batch has none.
    if (dir == "roberta") {
      EXPECT_LE(max_diff(m->forward(x.narrow(1, 0, 2)), b.at("logits")), 1e-5);
    }
  }
  m->train();
  const at::Tensor loss = at::cross_entropy_loss(m->forward(x), b.at("labels"));
  EXPECT_NEAR(loss.item<double>(), b.at("loss").item<double>(), 1e-6);
  loss.backward();
  int compared = 0;
  for (const auto& p : m->named_parameters()) {
    const at::Tensor& want = b.at("grad." + p.key());
    EXPECT_LE(max_diff(p.value().grad(), want), 1e-5 * want.abs().max().item<double>() + 1e-9) << p.key();
    ++compared;
  }
  EXPECT_EQ(compared, 41);  // every parameter: 5 embeddings, 16 per layer, 4 of the pooler and head
}

INSTANTIATE_TEST_SUITE_P(Directories, FromTransformers, ::testing::Values("bert", "bert_bin", "roberta"));

// A published checkpoint with its pre-training heads (BertForPreTraining): the encoder and the
// pooler load, the heads are left out, the classifier is new; the pooled output is
// transformers'.
TEST(Bert, APretrainingCheckpointGivesItsEncoderAndANewHead) {
  auto m = bert("bert_pretraining", 5);
  auto b = io("bert_pretraining");
  m->eval();
  torch::NoGradGuard no_grad;
  EXPECT_LE(max_diff(m->features(tokens(b)), b.at("pooled")), 1e-5);
  EXPECT_EQ(m->forward(tokens(b)).sizes(), (std::vector<std::int64_t>{4, 5}));
  EXPECT_EQ(m->head_name(), "classifier");
  // The model is built without drawing the weights the file overwrites; the new classifier is
  // then initialised as transformers' _init_weights does: zero bias, normal weight of std
  // initializer_range (0.02; over its 160 values the sample std is within 30 %: > 5 sigma).
  std::map<std::string, at::Tensor> p;
  for (const auto& t : m->named_parameters()) p[t.key()] = t.value();
  EXPECT_TRUE(p.at("classifier.bias").eq(0).all().item<bool>());
  const at::Tensor w = p.at("classifier.weight");
  EXPECT_TRUE(w.isfinite().all().item<bool>());
  EXPECT_NEAR(w.std().item<double>(), 0.02, 0.3 * 0.02) << w.numel() << " values";
  EXPECT_NEAR(w.mean().item<double>(), 0.0, 0.01);
}

// Padding is cut to the batch's longest sequence before the encoder: the batch padded to 400
// columns gives the logits of the batch as it is (12) and takes its memory, not the 10 MB of
// scores [4, 4, 400, 400] a forward over 400 columns would (bytes, counted by the tracking
// allocator); a micro-batch of its two short sequences gives those two rows' logits.
TEST(Bert, PaddingBeyondTheLongestSequenceIsCut) {
  install_cpu_tracking_allocator();
  auto m = bert("bert");
  auto b = io("bert");
  m->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor x = tokens(b);
  const at::Tensor padded = at::cat({x, at::zeros({4, 3, 388}, x.options())}, 2);
  const c10::Device cpu(c10::kCPU);
  MemoryMonitor as_is(cpu);
  m->forward(x);
  const std::int64_t peak = as_is.peak_delta();
  MemoryMonitor long_padded(cpu);
  EXPECT_LE(max_diff(m->forward(padded), b.at("logits")), 1e-6);
  EXPECT_LE(long_padded.peak_delta(), 2 * peak + (64 << 10));
  EXPECT_LE(max_diff(m->forward(padded.narrow(0, 2, 2)), b.at("logits").narrow(0, 2, 2)), 1e-5);
}

// model.trim_padding = false: the forward runs over the batch's full width (64 columns, 52 of
// them padding), as transformers' does for a batch padded to max_length: the same logits (the
// attention mask keeps the padding out; 1e-5 as above, sums over more columns of zeros) and
// more memory than the trimmed forward (scores [4, 4, 64, 64] against [4, 4, 12, 12]).
TEST(Bert, WithoutTrimmingTheForwardRunsOverTheFullWidth) {
  install_cpu_tracking_allocator();
  auto trimmed = bert("bert");
  auto full = bert("bert", 3, "trim_padding = false\n");
  auto b = io("bert");
  trimmed->eval();
  full->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor x = tokens(b);
  const at::Tensor padded = at::cat({x, at::zeros({4, 3, 52}, x.options())}, 2);
  const c10::Device cpu(c10::kCPU);
  MemoryMonitor cut(cpu);
  EXPECT_LE(max_diff(trimmed->forward(padded), b.at("logits")), 1e-6);
  const std::int64_t cut_peak = cut.peak_delta();
  MemoryMonitor wide(cpu);
  EXPECT_LE(max_diff(full->forward(padded), b.at("logits")), 1e-5);
  EXPECT_GT(wide.peak_delta(), 2 * cut_peak);
}

// RobertaModel's directory (bare names, a pooler its classification head does not use): the
// encoder loads, the pooler is left out; with roberta/'s classifier the logits are roberta/'s.
TEST(Bert, ARobertaModelWithAPoolerGivesItsEncoder) {
  auto m = bert("roberta_model");
  auto with_head = bert("roberta");
  {
    torch::NoGradGuard no_grad;
    const auto heads = with_head->named_parameters();
    for (auto& p : m->named_parameters()) {
      if (p.key().rfind("classifier.", 0) == 0) p.value().copy_(heads[p.key()]);
    }
  }
  auto b = io("roberta");
  m->eval();
  torch::NoGradGuard no_grad;
  EXPECT_LE(max_diff(m->forward(tokens(b)), b.at("logits")), 1e-5);
}

// A model from the keys has transformers' names and shapes for the same config.
TEST(Bert, FromScratchHasTransformersNamesAndShapes) {
  torch::manual_seed(3);
  auto scratch = build_model(Config::parse("name = \"bert\"\nvocab_size = 1000\nhidden_size = 64\n"
                                           "num_hidden_layers = 2\nintermediate_size = 128\n"
                                           "max_position_embeddings = 64\n"),
                             DataSpec{{3, 12}, 3});
  auto loaded = bert("bert");
  std::map<std::string, std::vector<std::int64_t>> a, b;
  for (const auto& p : scratch->named_parameters()) a[p.key()] = p.value().sizes().vec();
  for (const auto& p : loaded->named_parameters()) b[p.key()] = p.value().sizes().vec();
  EXPECT_EQ(a, b);
  EXPECT_EQ(scratch->blocks().size(), 2u);
  // transformers' initialisation: normal(0, 0.02) weights, zero biases, the padding row zero.
  for (const auto& p : scratch->named_parameters()) {
    if (p.key() == "bert.embeddings.word_embeddings.weight") {
      EXPECT_TRUE(p.value()[0].eq(0).all().item<bool>());
      EXPECT_NEAR(p.value().std().item<double>(), 0.02, 0.002);
    }
    if (p.key().find("dense.bias") != std::string::npos) {
      EXPECT_TRUE(p.value().eq(0).all().item<bool>()) << p.key();
    }
  }
}

// A BERT from a directory is built once, in its target dtype, its weights read into it a chunk
// (1 MiB) at a time (safetensors' reader): the load's peak is within 5 % of the model's bytes,
// as for the image models, in float32 and in bfloat16 from a float32 file (a reader that made
// the file's tensors first would add 100 % and 200 %). 19.0 M parameters make the chunk 2.8 % of
// the bfloat16 model.
TEST(Bert, ALoadBuildsTheModelOnceInItsDtype) {
  install_cpu_tracking_allocator();
  testing::TempDir tmp;
  const std::string dir = tmp / "bert";
  const DataSpec data{{3, 16}, 3};
  const std::string keys =
      "name = \"bert\"\nvocab_size = 30522\nhidden_size = 384\nnum_hidden_layers = 4\nnum_attention_heads = 6\n"
      "intermediate_size = 1536\nmax_position_embeddings = 128\n";
  std::map<std::string, at::Tensor> want;
  {
    torch::manual_seed(11);
    auto scratch = build_model(Config::parse(keys), data);
    ASSERT_TRUE(save_merged_hf_directory(*scratch, dir));  // no adapters: the model as it is
    for (const auto& p : scratch->named_parameters()) want[p.key()] = p.value().detach();
  }
  for (const auto& [name, dtype] : {std::pair{"float32", at::kFloat}, std::pair{"bfloat16", at::kBFloat16}}) {
    SCOPED_TRACE(name);
    MemoryMonitor load(c10::Device(c10::kCPU));
    auto m = build_model(
        Config::parse("name = \"bert\"\npath = \"" + dir + "\"\ndtype = \"" + std::string(name) + "\"\n"), data);
    const std::int64_t peak = load.peak_delta();
    std::int64_t bytes = 0, parameters = 0;
    for (const auto& p : m->named_parameters()) {
      EXPECT_EQ(p.value().scalar_type(), dtype) << p.key();
      EXPECT_TRUE(torch::equal(p.value(), want.at(p.key()).to(dtype))) << p.key();
      bytes += p.value().nbytes();
      parameters += p.value().numel();
    }
    for (const auto& b : m->buffers()) bytes += b.nbytes();
    EXPECT_GT(parameters, 18'000'000);
    EXPECT_LE(double(peak), 1.05 * double(bytes)) << peak << " bytes at the peak for a model of " << bytes;
  }
}

struct BadDir {
  std::string toml;
  std::string says;
};

TEST(Bert, DirectoriesAndInputsThatDoNotFitAreRefusedNamingTheFile) {
  const std::string p = "name = \"bert\"\npath = \"" + kDir + "/";
  const std::vector<BadDir> cases = {
      {p + "nowhere\"", "nowhere/config.json; a Hugging Face model directory holds config.json"},
      {p + "bad_deberta\"",
       "bad_deberta/config.json: model_type \"deberta-v2\" is not an architecture trainer builds; it reads bert, "
       "roberta"},
      {p + "bad_missing\"",
       "bad_missing/model.safetensors does not fit the architecture of its config.json: missing from the file: "
       "bert.encoder.layer.1.output.dense.weight (1)"},
      {p + "bad_layers\"", "missing from the file: bert.encoder.layer.2."},
      {p + "bad_shape\"",
       "bad_shape/model.safetensors does not fit the architecture of its config.json: mis-shaped: "
       "bert.encoder.layer.0.intermediate.dense.weight (file [64, 64] Float, model [128, 64])"},
      {p + "bert\"\nhidden_size = 128", "model.hidden_size is set beside model.path"},
      {"name = \"bert\"\nhidden_size = 100\nnum_attention_heads = 3",
       "hidden_size 100 is not a multiple of num_attention_heads 3"},
  };
  for (const BadDir& c : cases) {
    SCOPED_TRACE(c.toml);
    const std::string message = refusal(c.toml);
    EXPECT_NE(message.find(c.says), std::string::npos) << message;
  }
  EXPECT_NE(refusal("name = \"bert\"", DataSpec{{1, 28, 28}, 10}).find("model 'bert' takes token sequences"),
            std::string::npos);
  // A tokenizer with ids beyond the directory's vocabulary, or another padding token.
  DataSpec tokens{{3, 12}, 3};
  tokens.token_id_limit = 1001;
  EXPECT_NE(refusal(p + "bert\"", tokens)
                .find("bert/config.json: vocab_size 1000 does not cover the tokenizer's ids (up to 1000): the "
                      "tokenizer (dataset.tokenizer) is not this model's"),
            std::string::npos)
      << refusal(p + "bert\"", tokens);
  tokens.token_id_limit = 1000;
  tokens.pad_token_id = 5;
  EXPECT_NE(refusal(p + "bert\"", tokens).find("bert/config.json: pad_token_id 0, but the dataset pads with 5"),
            std::string::npos)
      << refusal(p + "bert\"", tokens);
  // Inputs: images, ids beyond the vocabulary, sequences beyond the positions.
  auto m = bert("bert");
  const auto says = [&](const at::Tensor& x, const std::string& what) {
    try {
      m->forward(x);
      ADD_FAILURE() << "no error for " << what;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  says(at::zeros({2, 12}), "model 'bert' takes token ids");
  says(at::stack({at::full({2, 12}, 1000, at::kLong), at::ones({2, 12}, at::kLong), at::zeros({2, 12}, at::kLong)}, 1),
       "a token id of 1000 is outside the model's vocabulary of 1000");
  says(at::stack({at::ones({2, 12}, at::kLong), at::full({2, 12}, 2, at::kLong)}, 1),
       "an attention mask value of 2; the mask is 1 for a token and 0 for padding");
  says(at::ones({1, 65}, at::kLong), "a sequence of 65 tokens; the model takes at most 64");
}

/// io.pt's batch of directory `dir`, twice: 8 samples of [3, 12] tokens (ids, mask, types) and
/// their labels, in order. A stand-in for a text dataset.
class IoTokens final : public Dataset {
 public:
  explicit IoTokens(const std::string& dir) {
    auto b = io(dir);
    inputs_ = at::cat({tokens(b), tokens(b)});
    targets_ = at::cat({b.at("labels"), b.at("labels")});
  }
  std::int64_t size() const override { return inputs_.size(0); }
  Batch get(const at::Tensor& idx) const override {
    return {inputs_.index_select(0, idx), targets_.index_select(0, idx)};
  }
  DataSpec spec() const override { return {{3, 12}, 3}; }

 private:
  at::Tensor inputs_, targets_;
};

class BertTraining : public testing::OneStepRun {
 protected:
  static void SetUpTestSuite() {
    dataset_registry().add("bert_io_tokens", [](const Config&, Split) -> std::shared_ptr<Dataset> {
      return std::make_shared<IoTokens>("bert");
    });
  }
  std::map<std::string, at::Tensor> train(const std::string& name, const std::vector<std::string>& overrides = {},
                                          const std::vector<std::shared_ptr<Plugin>>& extra = {}) {
    return OneStepRun::train(recipe(kDir + "/bert", "bert_io_tokens"), name, overrides, extra);
  }
  /// The logits of `model` (eval mode) on io.pt's batch, checked against those transformers
  /// computes with the run's exported hf_model (within 1e-5, as the loading test above).
  at::Tensor exported_logits_match(const RunResult& r, Model& model) {
    const std::string dir = r.run_dir + "/hf_model";
    EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors"));
    const auto python =
        transformers_logits(dir, kDir + "/bert", "hf_models check: BertForSequenceClassification (4, 3)");
    EXPECT_EQ(python.size(), 12u);
    auto b = io("bert");
    model.eval();
    torch::NoGradGuard no_grad;
    const at::Tensor mine = model.forward(tokens(b));
    if (python.size() == 12u) {
      EXPECT_LE(max_diff(mine, at::tensor(python, at::kDouble).view({4, 3})), 1e-5);
    }
    return mine;
  }
};

// One SGD step of a run (the token batch through the loader, the device move that keeps ids
// integers, the classification task's mean cross-entropy) moves each parameter by lr times
// transformers' gradient of the same batch (twice the io batch: the same mean): within float32
// rounding of the gradient (1e-5 of each tensor's largest, times lr, as above).
TEST_F(BertTraining, ARunsFirstStepIsTransformersGradientStep) {
  const auto trained = train("step");
  ASSERT_FALSE(trained.empty());
  auto initial = bert("bert");
  auto b = io("bert");
  for (const auto& p : initial->named_parameters()) {
    const at::Tensor grad = b.at("grad." + p.key());
    const at::Tensor expected = p.value().detach() - 0.1 * grad;
    // The step's update, trained - initial, against lr x gradient; the difference of two float32
    // weights is itself exact only to their rounding (2 float32 epsilons of the largest weight;
    // 1e-9 for the keys' biases, zero weights with a gradient of 0 in exact arithmetic).
    const double weights = p.value().abs().max().item<double>();
    EXPECT_LE(max_diff(trained.at(p.key()) - p.value().detach(), expected - p.value().detach()),
              0.1 * 1e-5 * grad.abs().max().item<double>() + 2 * 1.2e-7 * weights + 1e-9)
        << p.key();
  }
}

// Out of memory in the first forward: the batch is retried in two micro-batches of 4, each cut
// to its own longest sequence (12 and 12 here: each half holds a full row), and the step ends as
// without the OOM, to the rounding of a gradient summed in two parts. With activation
// checkpointing per encoder layer (the grad_checkpoint plugin), the same.
TEST_F(BertTraining, OutOfMemoryRecoveryAndCheckpointingTrainAlike) {
  const auto clean = train("clean");
  // The first step's forward gets 64 KiB beyond what is in use, less than the 8 samples'
  // activations.
  auto squeeze = std::make_shared<testing::Squeeze>(std::set<std::int64_t>{0}, 64 << 10);
  const auto squeezed = train("squeezed", {}, {squeeze});
  EXPECT_EQ(squeeze->ooms, 1);
  std::shared_ptr<Model> model;
  const auto checkpointed = OneStepRun::train(recipe(kDir + "/bert", "bert_io_tokens"), "checkpointed",
                                              {"plugins.load=[\"grad_checkpoint\"]"}, {}, nullptr, &model);
  // Each encoder layer is a block, which the plugin wrapped, and the forward goes through each.
  ASSERT_TRUE(model);
  const auto blocks = model->blocks();
  ASSERT_EQ(blocks.size(), 2u);
  int calls = 0;
  for (const auto& b : blocks) {
    EXPECT_TRUE(b->wrapped());
    b->set_wrapper([&calls](Block& block, const at::Tensor& x) {
      ++calls;
      return block.forward(x);
    });
  }
  auto b = io("bert");
  model->forward(tokens(b));
  EXPECT_EQ(calls, 2);
  for (const auto& [name, t] : clean) {
    EXPECT_LE(max_diff(squeezed.at(name), t), 1e-6) << name;
    EXPECT_LE(max_diff(checkpointed.at(name), t), 1e-6) << name;
  }
}

// What a run leaves: <run>/hf_model, config.json and model.safetensors, which transformers'
// from_pretrained loads into BertForSequenceClassification giving the trained model's logits
// (within 1e-5, as the loading test above).
TEST_F(BertTraining, TheRunLeavesAHuggingFaceDirectoryTransformersLoads) {
  RunResult r;
  std::shared_ptr<Model> model;
  OneStepRun::train(recipe(kDir + "/bert", "bert_io_tokens"), "export", {}, {}, &r, &model);
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  auto b = io("bert");
  const at::Tensor mine = exported_logits_match(r, *model);
  torch::NoGradGuard no_grad;
  // The trained model is not the initial one: the comparison sees the trained weights.
  EXPECT_GT(max_diff(mine, b.at("logits")), 1e-4);
}

// LoRA on the query and value projections (PEFT's names, as recipes/lora_bert.toml adapts them):
// a step trains the adapters and the classifier only, every other weight stays bit-identical;
// with export_merged, the run's hf_model is the merged model, which transformers loads as a
// plain BertForSequenceClassification giving the run's logits (within 1e-5, as above). The
// adapters matter there: B starts at zero and its first step, and so the merged term, scales
// with (alpha / rank)^2: at the default scale of 4 one step's term moved the logits by 8e-6,
// too little to tell a merged export from the base's; alpha 256 (a scale of 64) moves them by
// more than 1e-4.
TEST_F(BertTraining, LoraTrainsAdaptersAndHeadAndExportsTheMergedModelTransformersLoads) {
  RunResult r;
  std::shared_ptr<Model> model;
  const auto trained =
      OneStepRun::train(recipe(kDir + "/bert", "bert_io_tokens"), "lora",
                        {"plugins.load=[\"lora\"]", "plugins.lora.targets=[\"*.query\", \"*.value\"]",
                         "plugins.lora.rank=4", "plugins.lora.alpha=256", "plugins.lora.export_merged=true"},
                        {}, &r, &model);
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  auto initial = bert("bert");
  std::int64_t layers = 0, adapters = 0;
  for (const auto& p : initial->named_parameters()) {
    layers += p.key().find("attention.self.query.weight") != std::string::npos;
    if (p.key().rfind("classifier.", 0) == 0) {
      EXPECT_GT(max_diff(trained.at(p.key()), p.value()), 0.0) << p.key();
    } else {
      EXPECT_TRUE(torch::equal(trained.at(p.key()), p.value().detach())) << p.key();
    }
  }
  for (const auto& [name, t] : trained) adapters += name.find(".lora.") != std::string::npos;
  ASSERT_GE(layers, 2);
  EXPECT_EQ(adapters, layers * 2 * 2);  // A and B of query and value, per layer

  auto b = io("bert");
  const at::Tensor mine = exported_logits_match(r, *model);
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    if (p.key().find(".lora.B") != std::string::npos) p.value().zero_();
  }
  const double without = max_diff(model->forward(tokens(b)), mine);
  EXPECT_GT(without, 1e-4);
}

// bfloat16 autocast (the mixed_precision plugin, bf16 pinned: "auto" is fp32 on a CPU without
// native bf16) through the encoder, the additive mask and the LayerNorms: each tensor's update
// (trained - initial) is the float32 update within a tenth of its largest value (bfloat16 keeps
// 3 significant digits: its gradients are off by ~1 %; an update left out is off by all of it).
// Tensors whose float32 update is below 1e-7 (the keys' biases: 0 in exact arithmetic) are
// not compared.
TEST_F(BertTraining, MixedPrecisionTrainsCloseToFloat32) {
  const auto fp32 = train("fp32");
  const auto bf16 = train("bf16", {"plugins.load=[\"mixed_precision\"]", "plugins.mixed_precision.precision=\"bf16\""});
  auto initial = bert("bert");
  int compared = 0;
  for (const auto& p : initial->named_parameters()) {
    const at::Tensor& t = fp32.at(p.key());
    EXPECT_EQ(bf16.at(p.key()).scalar_type(), at::kFloat) << p.key();
    const at::Tensor update = t - p.value().detach(), bf16_update = bf16.at(p.key()) - p.value().detach();
    const double largest = update.abs().max().item<double>();
    if (largest < 1e-7) continue;
    EXPECT_LE(max_diff(bf16_update, update), 0.1 * largest) << p.key();
    ++compared;
  }
  EXPECT_GE(compared, 37);
}

}  // namespace
}  // namespace trainer
