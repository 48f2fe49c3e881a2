// Dataset "text" with dataset.masked_lm: BERT's masking rule as transformers'
// DataCollatorForLanguageModeling draws it, measured on the 15,000-line corpus of
// tests/text/hf_tokenizers.py with its BERT tokenizer; masks that depend on (seed, epoch,
// sample) alone; refusals naming what is missing; a masked-LM run from scratch, and the same
// run on two ranks, which trains as one process with the same global batch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "dist/dp_util.h"
#include "support/test_util.h"
#include "support/tiny_bert_recipe.h"
#include "trainer/data.h"
#include "trainer/error.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::read_file;
using testing::read_lines;
using testing::TempDir;
using testing::write_file;

const std::string kFixtures = TRAINER_HF_TOKENIZERS;
const std::string kBert = kFixtures + "/bert_uncased";

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

std::shared_ptr<Dataset> text_dataset(const std::string& keys, Split split = Split::Train) {
  const Config c = Config::parse("[dataset]\nname = \"text\"\n" + keys);
  return dataset_registry().get("text").factory(c.sub("dataset"), split);
}

std::string error_of(const std::string& keys) {
  try {
    text_dataset(keys);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

/// The id of added token `content` in tokenizer.json `file`.
std::int64_t token_id(const std::string& file, const std::string& content) {
  const nlohmann::json json = nlohmann::json::parse(read_file(file));
  for (const auto& t : json.at("added_tokens")) {
    if (t.at("content") == content) return t.at("id").get<std::int64_t>();
  }
  ADD_FAILURE() << file << " has no " << content;
  return -1;
}

/// The corpus's non-blank lines as a CSV of one column, "text" (quoted as Python's csv does).
std::string corpus_csv(const TempDir& tmp) {
  std::string csv = "text\n";
  for (const auto& line : read_lines(kFixtures + "/corpus.txt")) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string q;
    for (char c : line) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    csv += "\"" + q + "\"\n";
  }
  const std::string path = tmp / "corpus.csv";
  write_file(path, csv);
  return path;
}

class MaskedText : public ::testing::Test {
 protected:
  TempDir tmp_;
};

// Over the corpus's ~200,000 tokens that are not special: 15 % chosen (±0.5 %: the binomial's
// standard deviation is 0.08 %); of the ~30,000 chosen, 80 % the mask token, 10 % a random id
// and 10 % kept (each ±1 %, 4 standard deviations); random ids spread over the vocabulary;
// [CLS], [SEP] and padding never chosen; a chosen token's target is its id, every other
// target -100.
TEST_F(MaskedText, BertsRuleOnARealCorpus) {
  const std::string csv = corpus_csv(tmp_);
  const auto ds = text_dataset("train = " + quoted(csv) + "\ntokenizer = " + quoted(kBert) +
                               "\nmax_length = 128\nmasked_lm = true\nseed = 11");
  const std::int64_t mask_id = token_id(kBert + "/tokenizer.json", "[MASK]"), limit = ds->spec().token_id_limit;
  EXPECT_EQ(ds->spec().num_classes, 0);
  const at::Tensor lengths = ds->lengths();
  std::int64_t candidates = 0, chosen = 0, masked = 0, random = 0, kept = 0;
  std::set<std::int64_t> random_ids;
  for (std::int64_t begin = 0; begin < ds->size(); begin += 512) {
    const std::int64_t n = std::min<std::int64_t>(512, ds->size() - begin);
    const Batch b = ds->get_in_epoch(at::arange(begin, begin + n, at::kLong), 0);
    ASSERT_EQ(b.targets.sizes(), (std::vector<std::int64_t>{n, b.inputs.size(2)}));
    const auto in = b.inputs.accessor<std::int64_t, 3>();
    const auto y = b.targets.accessor<std::int64_t, 2>();
    for (std::int64_t k = 0; k < n; ++k) {
      const std::int64_t len = lengths[begin + k].item<std::int64_t>();
      ASSERT_EQ(y[k][0], -100);        // [CLS]
      ASSERT_EQ(y[k][len - 1], -100);  // [SEP]
      candidates += len - 2;
      for (std::int64_t t = 0; t < b.inputs.size(2); ++t) {
        if (y[k][t] == -100) continue;
        ASSERT_LT(t, len);  // padding is never chosen
        ASSERT_GE(y[k][t], 0);
        ++chosen;
        if (in[k][0][t] == mask_id) {
          ++masked;
        } else if (in[k][0][t] == y[k][t]) {
          ++kept;
        } else {
          ++random;
          ASSERT_LT(in[k][0][t], limit);
          random_ids.insert(in[k][0][t]);
        }
      }
    }
  }
  ASSERT_GT(candidates, 150000);
  EXPECT_NEAR(double(chosen) / double(candidates), 0.15, 0.005);
  EXPECT_NEAR(double(masked) / double(chosen), 0.8, 0.01);
  EXPECT_NEAR(double(random) / double(chosen), 0.1, 0.01);
  EXPECT_NEAR(double(kept) / double(chosen), 0.1, 0.01);
  EXPECT_GT(random_ids.size(), 2000u);  // of ~3,000 draws over 30,522 ids
}

// A sample's masks depend on (seed, epoch, sample) alone: read alone or in another batch, in
// the same epoch, they are the same; another epoch or seed draws others; evaluation (get())
// draws one set, the same at every call.
TEST_F(MaskedText, MasksDependOnSeedEpochAndSampleAlone) {
  const std::string keys = "train = " + quoted(kFixtures + "/texts.csv") + "\ntokenizer = " + quoted(kBert) +
                           "\ntext_pair = \"text_b\"\nmasked_lm = true\nmlm_probability = 0.3\n";
  const auto ds = text_dataset(keys);
  const auto other_seed = text_dataset(keys + "seed = 5\n");
  const auto sample = [](const Batch& b, std::int64_t row, std::int64_t len) {
    return at::cat({b.inputs[row][0].narrow(0, 0, len), b.targets[row].narrow(0, 0, len)});
  };
  const at::Tensor lengths = ds->lengths();
  const at::Tensor batch_idx = at::tensor({3, 17, 9, 30}, at::kLong);
  const Batch in_batch = ds->get_in_epoch(batch_idx, 2);
  for (std::int64_t k = 0; k < 4; ++k) {
    const std::int64_t i = batch_idx[k].item<std::int64_t>(), len = lengths[i].item<std::int64_t>();
    const Batch alone = ds->get_in_epoch(at::tensor({i}, at::kLong), 2);
    EXPECT_TRUE(sample(alone, 0, len).equal(sample(in_batch, k, len))) << "sample " << i;
  }
  const at::Tensor all = at::arange(ds->size(), at::kLong);
  const Batch e2 = ds->get_in_epoch(all, 2);
  EXPECT_TRUE(ds->get_in_epoch(all, 2).targets.equal(e2.targets));
  EXPECT_FALSE(ds->get_in_epoch(all, 3).targets.equal(e2.targets));
  EXPECT_FALSE(other_seed->get_in_epoch(all, 2).targets.equal(e2.targets));
  const Batch eval = ds->get(all);
  EXPECT_TRUE(ds->get(all).targets.equal(eval.targets));
  EXPECT_TRUE(ds->get(all).inputs.equal(eval.inputs));
  EXPECT_FALSE(eval.targets.equal(e2.targets));
  // Unchosen positions are the unmasked dataset's tokens.
  const Batch plain = text_dataset("train = " + quoted(kFixtures + "/texts.csv") + "\ntokenizer = " + quoted(kBert) +
                                   "\ntext_pair = \"text_b\"\n")
                          ->get(all);
  const at::Tensor unchosen = e2.targets.eq(-100);
  EXPECT_TRUE(e2.inputs.select(1, 0).masked_select(unchosen).equal(plain.inputs.select(1, 0).masked_select(unchosen)));
  EXPECT_TRUE(e2.inputs.narrow(1, 1, 2).equal(plain.inputs.narrow(1, 1, 2)));  // masks and token types
}

TEST_F(MaskedText, WhatCannotMaskIsRefusedNamingIt) {
  // A tokenizer without a mask token: bert_uncased's with [MASK] renamed.
  std::string json = read_file(kBert + "/tokenizer.json");
  for (std::size_t at = json.find("[MASK]"); at != std::string::npos; at = json.find("[MASK]", at)) {
    json.replace(at, 6, "[HIDE]");
  }
  const std::string no_mask = tmp_ / "tokenizer.json";
  write_file(no_mask, json);
  const std::string csv = "train = " + quoted(kFixtures + "/texts.csv") + "\n";
  EXPECT_NE(error_of(csv + "tokenizer = " + quoted(no_mask) + "\nmasked_lm = true")
                .find("no mask token ([MASK] or <mask>), which dataset.masked_lm = true puts in place"),
            std::string::npos);
  EXPECT_NE(error_of(csv + "tokenizer = " + quoted(kBert) + "\nmasked_lm = true\nlabels = [\"a\"]")
                .find("dataset.labels names classes; dataset.masked_lm = true has none"),
            std::string::npos);
}

constexpr const char* kRecipe = testing::kTinyBertRecipe;

class MaskedRuns : public testing::TrainerTest {
 protected:
  /// The masked data and task, plain SGD on the samples in order, no dropout, a checkpoint.
  std::vector<std::string> data() const {
    return {"dataset.name=\"text\"",
            "dataset.train=" + quoted(kFixtures + "/texts.csv"),
            "dataset.test=" + quoted(kFixtures + "/texts.csv"),
            "dataset.tokenizer=" + quoted(kBert),
            "dataset.text_pair=\"text_b\"",
            "dataset.max_length=40",
            "dataset.masked_lm=true",
            "task.name=\"masked_lm\"",
            "training.shuffle=false",
            "model.hidden_dropout_prob=0.0",
            "model.attention_probs_dropout_prob=0.0",
            "optim.name=\"sgd\"",
            "optim.lr=0.5",
            "optim.momentum=0.0",
            "optim.weight_decay=0.0",
            "checkpoint.every_epochs=1"};
  }
};

// Pre-training from scratch: 3 steps, an evaluation with the perplexity, the exported directory
// a masked-LM one. Pairing the masked data with a classifier, or the task with labels, is a
// usage error naming what to set.
TEST_F(MaskedRuns, PretrainingFromScratchAndWhatDoesNotPairWithIt) {
  const RunResult r = fit(kRecipe, data(), "scratch");
  ASSERT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(r.global_step, 3);
  const auto ppl = testing::metric_by_step(r.run_dir + "/metrics.jsonl", "eval/perplexity");
  ASSERT_EQ(ppl.size(), 1u);
  const auto loss = testing::metric_by_step(r.run_dir + "/metrics.jsonl", "eval/loss");
  EXPECT_NEAR(ppl.begin()->second, std::exp(loss.begin()->second), 1e-6 * ppl.begin()->second);
  // Not trained enough to predict much: the loss is about ln(30522) ~ 10.3.
  EXPECT_GT(loss.begin()->second, 5.0);
  EXPECT_NE(read_file(r.run_dir + "/hf_model/config.json").find("BertForMaskedLM"), std::string::npos);

  std::vector<std::string> o = data();
  o.push_back("task.name=\"classification\"");
  const RunResult classifier = fit(kRecipe, o, "classifier");
  EXPECT_EQ(classifier.exit_code, kExitUsage);
  EXPECT_NE(classifier.message.find("dataset text gives a target per token (masked language modelling: "
                                    "dataset.masked_lm = true), which task.name = \"masked_lm\" reads; task "
                                    "'classification': "),
            std::string::npos)
      << classifier.message;
  o = data();
  o.push_back("task.name=\"regression\"");
  const RunResult regression = fit(kRecipe, o, "regression");
  EXPECT_EQ(regression.exit_code, kExitUsage);
  EXPECT_NE(regression.message.find("dataset text gives a target per token"), std::string::npos) << regression.message;
  o = data();
  o.push_back("dataset.mlm_probability=0.0");
  const RunResult none = fit(kRecipe, o, "none");
  EXPECT_EQ(none.exit_code, kExitUsage);
  EXPECT_NE(none.message.find("mlm_probability"), std::string::npos) << none.message;
  o = data();
  o.push_back("dataset.masked_lm=false");
  const RunResult labels = fit(kRecipe, o, "labels");
  EXPECT_EQ(labels.exit_code, kExitUsage);
  EXPECT_NE(labels.message.find("masked language modelling needs the tokens a text dataset hides: dataset.name = "
                                "\"text\" with dataset.masked_lm = true"),
            std::string::npos)
      << labels.message;
}

std::string trainer_cmd() {
  return std::string("TRAINER_CONFIG_PATH=") + TRAINER_SOURCE_DIR + "/configs " + TRAINER_CLI;
}

// Two ranks with the same global batch (47: 24 and 23 a rank; the last batch, of 1 sample,
// leaves rank 1 none) train as one process computing the whole batch at once: the loss of each
// step is the mean over the global batch's masked tokens on both (the ranks' parts hold
// different numbers of them), and so are the evaluation and the weights after the 2 SGD steps,
// to float32 rounding (1e-6 relative for the losses, 1e-6 for weights of ~0.1: the ranks'
// kernels sum halves, and they divide by a guess of the global weight first and correct it
// after the all-reduce). Weighing the ranks by samples moves the losses by 1.6e-4 and 3.6e-4
// relative here, and the evaluation after them by 3e-3.
TEST_F(MaskedRuns, TwoRanksTrainAsOneProcess) {
  TempDir tmp;
  const std::string recipe = tmp / "mlm.toml";
  write_file(recipe, kRecipe);
  std::string args;
  for (const auto& d : data()) args += " '" + d + "'";
  const auto one = testing::run_command(trainer_cmd() + " --recipe " + recipe + args +
                                        " training.batch_size=47 --log-level warn "
                                        "--run-dir " +
                                        (tmp / "one"));
  ASSERT_EQ(one.code, 0) << one.text;
  const auto two = testing::run_command(trainer_cmd() + " launch --nproc 2 -- --recipe " + recipe + args +
                                        " training.batch_size=47 --run-dir " + (tmp / "two"));
  ASSERT_EQ(two.code, 0) << two.text;
  const auto loss1 = testing::metric_by_step(tmp / "one/metrics.jsonl", "train/loss");
  const auto loss2 = testing::metric_by_step(tmp / "two/metrics.jsonl", "train/loss");
  ASSERT_EQ(loss1.size(), 2u);
  ASSERT_EQ(loss2.size(), 2u);
  for (const auto& [step, v] : loss1) EXPECT_NEAR(loss2.at(step), v, 1e-6 * v) << "step " << step;
  const auto eval1 = testing::metric_by_step(tmp / "one/metrics.jsonl", "eval/loss");
  const auto eval2 = testing::metric_by_step(tmp / "two/metrics.jsonl", "eval/loss");
  ASSERT_EQ(eval1.size(), 1u);
  EXPECT_NEAR(eval2.begin()->second, eval1.begin()->second, 1e-6 * eval1.begin()->second);
  EXPECT_LE(
      testing::largest_difference(tmp / "one/checkpoints/step_00000002.pt", tmp / "two/checkpoints/step_00000002.pt"),
      1e-6);
}

}  // namespace
}  // namespace trainer
