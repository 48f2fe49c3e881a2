// The dataset "text": CSV and JSON Lines files that Python's csv and json modules write
// (tests/text/hf_tokenizers.py), tokenized with tokenizers Hugging Face's libraries wrote, give
// the batches transformers' tokenizer gives (padding to the longest, truncation, pairs); bad
// rows are named with file and line or skipped; a model "bert" trains on it, its vocabulary
// checked against the tokenizer; training.group_by_length batches its samples by length.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "support/forward_squeeze.h"
#include "support/hf_io.h"
#include "support/sentencepiece_skip.h"
#include "support/test_util.h"
#include "support/tiny_bert_recipe.h"
#include "support/tiny_text.h"
#include "trainer/data.h"
#include "trainer/error.h"
#include "trainer/plugin.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::read_file;
using testing::TempDir;
using testing::write_file;

const std::string kFixtures = TRAINER_HF_TOKENIZERS;

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

/// Dataset "text" from the [dataset] keys `keys`, one split.
std::shared_ptr<Dataset> text_dataset(const std::string& keys, Split split = Split::Train) {
  const Config c = Config::parse("[dataset]\nname = \"text\"\n" + keys);
  return dataset_registry().get("text").factory(c.sub("dataset"), split);
}

/// The UsageError building that dataset gives.
std::string error_of(const std::string& keys, Split split = Split::Train) {
  try {
    text_dataset(keys, split);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

std::string join(const at::Tensor& row) {
  std::string s;
  for (std::int64_t i = 0; i < row.numel(); ++i) s += (i ? " " : "") + std::to_string(row[i].item<std::int64_t>());
  return s;
}

struct Case {
  std::string tokenizer;
  bool pair;
  std::string file;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.tokenizer << (c.pair ? " pairs " : " ") << c.file; }

class TextBatches : public ::testing::TestWithParam<Case> {};

TEST_P(TextBatches, AreTheBatchesTransformersPadsToTheLongest) {
  const Case c = GetParam();
  if (c.tokenizer == "albert" || c.tokenizer == "t5") {
    TRAINER_SKIP_WITHOUT_SENTENCEPIECE();
  }
  const auto ds = text_dataset("train = " + quoted(kFixtures + "/" + c.file) +
                               "\ntokenizer = " + quoted(kFixtures + "/" + c.tokenizer) + "\nmax_length = 24\n" +
                               (c.pair ? "text_pair = \"text_b\"\n" : ""));
  ASSERT_EQ(ds->size(), 48);
  const auto expected = read_file(kFixtures + "/" + c.tokenizer + "/batch-" + (c.pair ? "1" : "0") + ".txt");
  const Batch b = ds->get(at::arange(16));
  ASSERT_EQ(b.inputs.scalar_type(), at::kLong);
  ASSERT_EQ(b.inputs.size(0), 16);
  ASSERT_EQ(b.inputs.size(1), 3);
  std::string got;
  for (std::int64_t i = 0; i < 16; ++i) {
    got += join(b.inputs[i][0]) + "|" + join(b.inputs[i][1]) + "|" + join(b.inputs[i][2]) + "\n";
  }
  EXPECT_EQ(got, expected);
  // The labels: "neg", "neutral", "pos" in turn, sorted (CSV), or their indices (JSON Lines).
  EXPECT_TRUE(b.targets.equal(at::arange(16).remainder(3))) << b.targets;
  const DataSpec spec = ds->spec();
  EXPECT_EQ(spec.num_classes, 3);
  EXPECT_GE(spec.token_id_limit, 4000);
  EXPECT_EQ(spec.pad_token_id, c.tokenizer == "roberta" ? 1 : 0);  // <pad> is 0 in albert's and t5's models
  ASSERT_EQ(spec.sample_shape.size(), 2u);
  EXPECT_EQ(spec.sample_shape[0], 3);
  EXPECT_LE(spec.sample_shape[1], 24);  // the longest sample
  // A micro-batch of some of them is padded to its own longest, and is a slice of the batch.
  const Batch part = ds->get(at::arange(8, 12));
  const std::int64_t width = part.inputs.size(2);
  EXPECT_EQ(width, part.inputs.select(1, 1).sum(1).max().item<std::int64_t>());
  EXPECT_TRUE(part.inputs.equal(b.inputs.slice(0, 8, 12).slice(2, 0, width)));
  // padding = "max_length": the same micro-batch max_length wide, the tokens followed by the pad
  // id, attention mask 0 and token type 0; the data spec says that width.
  const auto fixed = text_dataset(
      "train = " + quoted(kFixtures + "/" + c.file) + "\ntokenizer = " + quoted(kFixtures + "/" + c.tokenizer) +
      "\nmax_length = 24\npadding = \"max_length\"\n" + (c.pair ? "text_pair = \"text_b\"\n" : ""));
  EXPECT_EQ(fixed->spec().sample_shape, (std::vector<std::int64_t>{3, 24}));
  const Batch wide = fixed->get(at::arange(8, 12));
  ASSERT_EQ(wide.inputs.sizes(), (at::IntArrayRef{4, 3, 24}));
  EXPECT_TRUE(wide.inputs.slice(2, 0, width).equal(part.inputs));
  const at::Tensor rest = wide.inputs.slice(2, width);
  EXPECT_TRUE(rest.select(1, 0).eq(spec.pad_token_id).all().item<bool>());
  EXPECT_EQ(rest.select(1, 1).abs().sum().item<std::int64_t>() + rest.select(1, 2).abs().sum().item<std::int64_t>(), 0);
  EXPECT_TRUE(wide.targets.equal(part.targets));
}

INSTANTIATE_TEST_SUITE_P(Text, TextBatches,
                         ::testing::Values(Case{"bert_cased", false, "texts.csv"},
                                           Case{"bert_cased", true, "texts.csv"}, Case{"roberta", false, "texts.jsonl"},
                                           Case{"roberta", true, "texts.jsonl"}, Case{"albert", false, "texts.csv"},
                                           Case{"albert", true, "texts.jsonl"}, Case{"t5", true, "texts.csv"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return c.tokenizer + (c.pair ? "_pairs_" : "_") +
                                  (c.file.find("jsonl") != std::string::npos ? "jsonl" : "csv");
                         });

class TextRows : public ::testing::Test {
 protected:
  std::string keys(const std::string& file, const std::string& more = "") {
    return "train = " + quoted(tmp_ / file) + "\ntokenizer = " + quoted(kFixtures + "/bert_cased/tokenizer.json") +
           "\n" + more;
  }
  TempDir tmp_;
};

TEST_F(TextRows, ABadRowIsNamedByFileAndLineOrSkipped) {
  // Line 3 starts a quoted text over two lines; the rows after it are counted from the file's lines.
  write_file(tmp_ / "a.csv",
             "text,label\n"
             "fine,pos\n"
             "\"two, \"\"quoted\"\"\nlines\",neg\n"
             "too,many,fields\n"
             "   ,pos\n"
             "bad \xC3\x28 byte,neg\n"
             "last,pos\n");
  EXPECT_NE(error_of(keys("a.csv")).find("a.csv line 5: 3 fields; the header has 2 (dataset.bad_rows = \"skip\""),
            std::string::npos)
      << error_of(keys("a.csv"));
  const auto ds = text_dataset(keys("a.csv", "bad_rows = \"skip\""));
  EXPECT_EQ(ds->size(), 3);  // fine, the two lines, last
  EXPECT_EQ(ds->spec().num_classes, 2);
  write_file(tmp_ / "b.csv", "text,label\nok,pos\n   ,pos\n");
  EXPECT_NE(error_of(keys("b.csv")).find("b.csv line 3: column 'text' is empty"), std::string::npos);
  write_file(tmp_ / "c.csv", "text,label\nok,pos\nbad \xC3\x28,pos\n");
  EXPECT_NE(error_of(keys("c.csv")).find("c.csv line 3: column 'text' is not valid UTF-8 (at byte 4)"),
            std::string::npos);
  // A label of the test split that the training split does not have.
  write_file(tmp_ / "test.csv", "text,label\nok,neg\nwhat,maybe\n");
  EXPECT_NE(error_of(keys("a.csv", "test = " + quoted(tmp_ / "test.csv")), Split::Test)
                .find("the training split's: neg, pos"),
            std::string::npos);
  EXPECT_NE(
      error_of(keys("a.csv", "test = " + quoted(tmp_ / "test.csv") + "\nlabels = [\"neg\", \"pos\"]"), Split::Test)
          .find("test.csv line 3: the label 'maybe' is not a class (dataset.labels: neg, pos)"),
      std::string::npos);
  // JSON Lines: a line that is not an object, a missing key, a label of another type.
  write_file(tmp_ / "d.jsonl",
             "{\"text\": \"ok\", \"label\": 1}\n[1, 2]\n{\"label\": 0}\n{\"text\": \"x\", \"label\": 1.5}\n");
  EXPECT_NE(error_of(keys("d.jsonl")).find("d.jsonl line 2: not a JSON object"), std::string::npos);
  const auto skipped = text_dataset(keys("d.jsonl", "bad_rows = \"skip\""));
  EXPECT_EQ(skipped->size(), 1);
  EXPECT_EQ(skipped->spec().num_classes, 2);  // the index 1: classes 0 and 1
  // A line that is not JSON says where; a label "2" is an index as CSV's 2 is.
  write_file(tmp_ / "e.jsonl", "{\"text\": \"x\", \"label\": \"2\"}\n{bad json\n");
  EXPECT_NE(error_of(keys("e.jsonl")).find("e.jsonl line 2: not valid JSON (at byte 2)"), std::string::npos)
      << error_of(keys("e.jsonl"));
  EXPECT_EQ(text_dataset(keys("e.jsonl", "bad_rows = \"skip\""))->spec().num_classes, 3);
  // Indices and names mixed in the training split: which is which is not guessed.
  write_file(tmp_ / "f.csv", "text,label\na,1\nb,pos\n");
  EXPECT_NE(
      error_of(keys("f.csv"))
          .find("f.csv line 3: the label 'pos' is a name where line 2's '1' is a class index; give the class names"),
      std::string::npos)
      << error_of(keys("f.csv"));
}

// Without dataset.labels, class indices are below max(rows, 1024): what the rows can mean. One
// beyond (a label past 64 bits too) is refused naming the file, the line and the label.
TEST_F(TextRows, AClassIndexBeyondWhatTheRowsCanMeanIsNamedByFileLineAndValue) {
  write_file(tmp_ / "tokenizer.json", testing::kTinyTokenizer);
  const auto keys_of = [&](const std::string& file) {
    return "train = " + quoted(tmp_ / file) + "\ntokenizer = " + quoted(tmp_ / "tokenizer.json") + "\n";
  };
  write_file(tmp_ / "big.csv", "text,label\nhello,0\nworld,400000000\n");
  EXPECT_NE(error_of(keys_of("big.csv"))
                .find(tmp_ / "big.csv" +
                      " line 3: the label 400000000 is not a class index 2 rows can mean (without dataset.labels, "
                      "class indices are below max(rows, 1024) = 1024); name the classes in order in dataset.labels"),
            std::string::npos)
      << error_of(keys_of("big.csv"));
  write_file(tmp_ / "huge.jsonl",
             "{\"text\": \"hello\", \"label\": 0}\n{\"text\": \"world\", \"label\": 18446744073709551615}\n");
  EXPECT_NE(
      error_of(keys_of("huge.jsonl")).find("huge.jsonl line 2: the label 18446744073709551615 is not a class index"),
      std::string::npos)
      << error_of(keys_of("huge.jsonl"));
  write_file(tmp_ / "fine.csv", "text,label\nhello,0\nworld,1023\n");
  EXPECT_EQ(text_dataset(keys_of("fine.csv"))->spec().num_classes, 1024);
}

TEST_F(TextRows, SettingsThatCannotWorkAreRefusedNamingTheKey) {
  write_file(tmp_ / "a.tsv", "sentence\tlabel\nhello there\tpos\n");
  EXPECT_NE(error_of(keys("a.tsv"))
                .find("dataset.text = \"text\": no such column in dataset.train = \"" + (tmp_ / "a.tsv") +
                      "\"; its header names sentence, label"),
            std::string::npos)
      << error_of(keys("a.tsv"));
  EXPECT_EQ(text_dataset(keys("a.tsv", "text = \"sentence\""))->size(), 1);
  write_file(tmp_ / "a.csv", "text,label\nhello,pos\n");
  EXPECT_NE(error_of(keys("a.csv", "text_pair = \"text\"\nmax_length = 3"))
                .find("dataset.max_length = 3 leaves no room for text beside the 3 special tokens"),
            std::string::npos);
  const std::string no_tokenizer = "train = " + quoted(tmp_ / "a.csv") + "\ntokenizer = " + quoted(tmp_.str());
  EXPECT_NE(error_of(no_tokenizer)
                .find("dataset.tokenizer: " + tmp_.str() +
                      ": a directory without a tokenizer (spiece.model or spm.model with tokenizer_config.json, "
                      "or tokenizer.json"),
            std::string::npos)
      << error_of(no_tokenizer);
  write_file(tmp_ / "open.csv", "text,label\n\"never closed,pos\n");
  EXPECT_NE(error_of(keys("open.csv")).find("open.csv\" line 2: a quoted field is not closed before the end"),
            std::string::npos)
      << error_of(keys("open.csv"));
}

// transformers' BertForSequenceClassification and RobertaForSequenceClassification (random,
// written by save_pretrained with their tokenizer's vocabulary) on real text: 16 samples of the
// corpus with their pairs, read by the dataset with the model's tokenizer, are the ids
// transformers' tokenizer gives (padding="longest", truncation=True, max_length=40), and the
// model loaded from the directory gives transformers' logits on them within 1e-5 (float32
// rounding, as in tests/model/bert_test.cpp).
TEST(TextModels, ModelsFromTransformersGiveItsLogitsOnRealText) {
  for (const std::string kind : {"bert_uncased", "roberta"}) {
    SCOPED_TRACE(kind);
    const std::string dir = kFixtures + "/" + kind + "_model";
    const auto ds = text_dataset("train = " + quoted(kFixtures + "/texts.csv") + "\ntext_pair = \"text_b\"\n" +
                                 "tokenizer = " + quoted(kFixtures + "/" + kind) + "\nmax_length = 40");
    const Batch b = ds->get(at::arange(16, at::kLong));
    auto io = testing::hf_io(dir + "/io.pt");
    ASSERT_TRUE(torch::equal(b.inputs.select(1, 0), io.at("input_ids")));
    auto model = build_model(Config::parse("name = \"bert\"\npath = " + quoted(dir) + "\n"), ds->spec());
    model->eval();
    torch::NoGradGuard no_grad;
    const at::Tensor logits = model->forward(b.inputs);
    EXPECT_LE((logits.to(at::kDouble) - io.at("logits").to(at::kDouble)).abs().max().item<double>(), 1e-5);
    EXPECT_GT(io.at("logits").abs().max().item<double>(), 1e-3);  // not a model that outputs zeros
  }
}

constexpr const char* kRecipe = testing::kTinyBertRecipe;

class TextRuns : public testing::TrainerTest {};

TEST_F(TextRuns, ABertFromScratchTrainsOnItWithTheTokenizersVocabulary) {
  const std::vector<std::string> data = {"dataset.name=\"text\"",
                                         "dataset.train=" + quoted(kFixtures + "/texts.csv"),
                                         "dataset.test=" + quoted(kFixtures + "/texts.csv"),
                                         "dataset.tokenizer=" + quoted(kFixtures + "/roberta"),
                                         "dataset.text_pair=\"text_b\"",
                                         "dataset.max_length=40"};
  std::shared_ptr<Model> model;
  std::vector<std::string> o = data;
  o.push_back("model.layout=\"roberta\"");
  const RunResult r = fit(kRecipe, o, "scratch", {}, &model);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(r.global_step, 3);  // 48 samples in batches of 16
  ASSERT_TRUE(model);
  // The embedding holds the tokenizer's ids, its padding row is the tokenizer's <pad>.
  const auto ds =
      text_dataset("train = " + quoted(kFixtures + "/texts.csv") + "\ntokenizer = " + quoted(kFixtures + "/roberta"));
  for (const auto& p : model->named_parameters()) {
    if (p.key().find("word_embeddings.weight") != std::string::npos) {
      EXPECT_EQ(p.value().size(0), ds->spec().token_id_limit);
      EXPECT_EQ(p.value()[1].abs().sum().item<double>(), 0.0);
    }
  }
  // A model whose vocabulary is smaller than the tokenizer's ids is refused, naming both.
  o = data;
  o.push_back("model.vocab_size=100");
  const RunResult small = fit(kRecipe, o, "small");
  EXPECT_EQ(small.exit_code, kExitUsage);
  EXPECT_NE(small.message.find("model 'bert': model.vocab_size 100 does not cover the tokenizer's ids"),
            std::string::npos)
      << small.message;
  o = data;
  o.push_back("model.pad_token_id=0");
  const RunResult pad = fit(kRecipe, o, "pad");
  EXPECT_EQ(pad.exit_code, kExitUsage);
  EXPECT_NE(pad.message.find("pad_token_id 0, but the dataset pads with 1"), std::string::npos) << pad.message;
}

/// The dataset indices of each training micro-batch, by epoch.
class Batches final : public Plugin {
 public:
  std::string name() const override { return "batches"; }
  std::vector<Event> events() const override { return {Event::BeforeForward}; }
  void on_event(EventContext& ctx, Control&) override {
    const at::Tensor idx = ctx.indices->to(at::kLong).contiguous();
    seen[ctx.state.epoch].emplace_back(idx.data_ptr<std::int64_t>(), idx.data_ptr<std::int64_t>() + idx.numel());
  }
  std::map<std::int64_t, std::vector<std::vector<std::int64_t>>> seen;
};

// training.group_by_length: each epoch visits every sample once, in batches of samples of
// similar length, the longest batch first, computing fewer padded tokens than the order without
// grouping; a resume continues the same order to the same weights, and one that would change it is refused; a
// dataset without lengths is a usage error.
TEST_F(TextRuns, GroupedByLengthTheBatchesHoldSimilarLengthsTheLongestFirst) {
  const std::vector<std::string> data = {"dataset.name=\"text\"",
                                         "dataset.train=" + quoted(kFixtures + "/texts.csv"),
                                         "dataset.tokenizer=" + quoted(kFixtures + "/bert_uncased"),
                                         "dataset.max_length=40",
                                         "training.batch_size=4",
                                         "training.epochs=2",
                                         "eval.every_epochs=0",
                                         "eval.at_end=false"};
  const auto ds = text_dataset("train = " + quoted(kFixtures + "/texts.csv") +
                               "\ntokenizer = " + quoted(kFixtures + "/bert_uncased") + "\nmax_length = 40");
  const at::Tensor lengths = ds->lengths();
  ASSERT_EQ(lengths.numel(), 48);
  const auto length = [&](std::int64_t i) { return lengths[i].item<std::int64_t>(); };
  const auto computed = [&](const std::vector<std::vector<std::int64_t>>& batches) {
    std::int64_t tokens = 0;
    for (const auto& b : batches) {
      std::int64_t longest = 0;
      for (auto i : b) longest = std::max(longest, length(i));
      tokens += longest * static_cast<std::int64_t>(b.size());
    }
    return tokens;
  };
  // The batches are the dataset's own: each one as wide as its longest sample.
  EXPECT_EQ(ds->get(at::tensor(std::vector<std::int64_t>{0, 1})).inputs.size(2), std::max(length(0), length(1)));

  std::vector<std::string> o = data;
  o.push_back("training.group_by_length=true");
  auto grouped = std::make_shared<Batches>();
  std::shared_ptr<Model> whole;
  const RunResult r = fit(kRecipe, o, "grouped", {grouped}, &whole);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  auto plain = std::make_shared<Batches>();
  ASSERT_EQ(fit(kRecipe, data, "plain", {plain}).exit_code, 0);
  const std::int64_t longest = lengths.max().item<std::int64_t>();
  for (std::int64_t epoch : {0, 1}) {
    const auto& batches = grouped->seen[epoch];
    ASSERT_EQ(batches.size(), 12u);
    std::vector<std::int64_t> all, lens;
    for (const auto& b : batches) {
      for (auto i : b) {
        all.push_back(i);
        lens.push_back(length(i));
      }
    }
    std::sort(all.begin(), all.end());
    for (std::int64_t i = 0; i < 48; ++i) EXPECT_EQ(all[static_cast<std::size_t>(i)], i);
    // Groups of 48 / 4 / 4 = 3 batches, each longest first but for its first sample (the
    // longest of all is swapped into the first batch).
    EXPECT_EQ(lens.front(), longest);
    for (std::size_t g = 0; g < 48; g += 12) {
      EXPECT_TRUE(std::is_sorted(lens.rend() - static_cast<std::ptrdiff_t>(g + 12),
                                 lens.rend() - static_cast<std::ptrdiff_t>(g + 1)))
          << "epoch " << epoch << ", the group at " << g;
    }
    EXPECT_LT(computed(batches), computed(plain->seen[epoch])) << "epoch " << epoch;
  }
  EXPECT_NE(grouped->seen[0], grouped->seen[1]) << "the groups are drawn from each epoch's shuffle";

  // Interrupted after 5 steps and resumed: the same batches as the run without a stop.
  o = data;
  o.push_back("training.group_by_length=true");
  o.push_back("training.max_steps=5");
  o.push_back("checkpoint.every_steps=5");
  ASSERT_EQ(fit(kRecipe, o, "part").exit_code, 0);
  const auto resume = [&](std::vector<std::string> extra, const std::string& name, const std::shared_ptr<Batches>& seen,
                          std::shared_ptr<Model>* model = nullptr) {
    std::vector<std::string> ov = data;
    ov.insert(ov.end(), extra.begin(), extra.end());
    TrainerOptions opts = options_for(kRecipe, ov, name, {seen});
    opts.resume = tmp_ / "part";
    Trainer t(std::move(opts));
    const RunResult result = t.fit();
    if (model) *model = t.model();
    return result;
  };
  auto rest = std::make_shared<Batches>();
  std::shared_ptr<Model> resumed_model;
  const RunResult resumed = resume({"training.group_by_length=true"}, "resumed", rest, &resumed_model);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.message;
  // And the same weights, bit for bit (dropout's random draws resumed with the generators).
  ASSERT_TRUE(whole && resumed_model);
  auto resumed_params = resumed_model->named_parameters();
  for (const auto& p : whole->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value(), resumed_params[p.key()])) << p.key();
  }
  std::vector<std::vector<std::int64_t>> expected(grouped->seen[0].begin() + 5, grouped->seen[0].end());
  EXPECT_EQ(rest->seen[0], expected);
  EXPECT_EQ(rest->seen[1], grouped->seen[1]);
  const RunResult off = resume({}, "off", std::make_shared<Batches>());
  EXPECT_EQ(off.exit_code, kExitUsage);
  EXPECT_NE(off.message.find("training.group_by_length = true there, (not set) now"), std::string::npos) << off.message;
  const RunResult wider =
      resume({"training.group_by_length=true", "training.batch_size=8"}, "wider", std::make_shared<Batches>());
  EXPECT_EQ(wider.exit_code, kExitUsage);
  EXPECT_NE(wider.message.find("training.batch_size = 4 there, 8 now"), std::string::npos) << wider.message;
  // Other lengths order the samples otherwise.
  const RunResult shorter =
      resume({"training.group_by_length=true", "dataset.max_length=12"}, "shorter", std::make_shared<Batches>());
  EXPECT_EQ(shorter.exit_code, kExitUsage);
  EXPECT_NE(shorter.message.find("training sample lengths = "), std::string::npos) << shorter.message;
}

}  // namespace

/// Each training micro-batch's step, dataset indices, columns and longest sample (its mask's
/// largest row sum), in the order the forwards ran.
class MicroBatches final : public Plugin {
 public:
  struct Seen {
    std::int64_t step;
    std::vector<std::int64_t> indices;
    std::int64_t columns, longest;
  };
  std::string name() const override { return "micro_batches"; }
  std::vector<Event> events() const override { return {Event::BeforeForward}; }
  int default_priority() const override { return 100; }  // after the squeeze: the attempt that runs out counts
  void on_event(EventContext& ctx, Control&) override {
    const at::Tensor idx = ctx.indices->to(at::kLong).contiguous();
    const at::Tensor inputs = ctx.batch->inputs;
    seen.push_back({ctx.state.global_step,
                    {idx.data_ptr<std::int64_t>(), idx.data_ptr<std::int64_t>() + idx.numel()},
                    inputs.size(2),
                    inputs.select(1, 1).sum(1).max().item<std::int64_t>()});
  }
  std::vector<Seen> seen;
};

// Out of memory in the first forward on real text: the batch of 16 is retried in two
// micro-batches of 8, the same samples in the same order, each exactly once, and the two steps
// end as without the OOM. The micro-batches are slices of the batch, padded to its longest
// sample; the model cuts each to its own longest (model.trim_padding), which for the first
// batch of seed 1 is 26 columns of 32 in one of them. Pinned for the comparison: no dropout (a split draws other
// masks) and SGD (its update is linear in the gradient, which the split sums in another order:
// float32 rounding, 1e-7 of a gradient of about 1, times lr 0.1, over two steps: 1e-6).
TEST_F(TextRuns, AnOutOfMemoryRetryResplitsTheSameSamples) {
  const std::vector<std::string> o = {"dataset.name=\"text\"",
                                      "dataset.train=" + quoted(kFixtures + "/texts.csv"),
                                      "dataset.tokenizer=" + quoted(kFixtures + "/bert_uncased"),
                                      "dataset.max_length=40",
                                      "model.hidden_dropout_prob=0.0",
                                      "model.attention_probs_dropout_prob=0.0",
                                      "optim.name=\"sgd\"",
                                      "optim.lr=0.1",
                                      "training.max_steps=2",
                                      "eval.every_epochs=0",
                                      "eval.at_end=false",
                                      "plugins.load=[\"oom_backoff\"]",
                                      "run.seed=1"};  // a shuffle whose first batch's halves differ in length
  std::shared_ptr<Model> clean_model, squeezed_model;
  auto clean = std::make_shared<MicroBatches>();
  const RunResult c = fit(kRecipe, o, "clean", {clean}, &clean_model);
  ASSERT_EQ(c.exit_code, 0) << c.message;
  auto squeeze = std::make_shared<testing::Squeeze>(std::set<std::int64_t>{0});
  auto squeezed = std::make_shared<MicroBatches>();
  const RunResult r = fit(kRecipe, o, "squeezed", {squeeze, squeezed}, &squeezed_model);
  ASSERT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(squeeze->ooms, 1);
  ASSERT_EQ(clean->seen.size(), 2u);
  ASSERT_EQ(squeezed->seen.size(), 4u);  // the attempt that ran out, its two halves, step 1
  const auto& batch = clean->seen[0];
  ASSERT_EQ(batch.indices.size(), 16u);
  EXPECT_EQ(squeezed->seen[0].indices, batch.indices);
  std::vector<std::int64_t> halves = squeezed->seen[1].indices;
  halves.insert(halves.end(), squeezed->seen[2].indices.begin(), squeezed->seen[2].indices.end());
  EXPECT_EQ(halves, batch.indices);
  std::int64_t shorter = 0;
  for (int h : {1, 2}) {
    const auto& half = squeezed->seen[static_cast<std::size_t>(h)];
    EXPECT_EQ(half.step, 0);
    EXPECT_EQ(half.indices.size(), 8u);
    EXPECT_EQ(half.columns, batch.columns);
    EXPECT_LE(half.longest, batch.longest);
    shorter += half.longest < batch.columns ? 1 : 0;
  }
  EXPECT_EQ(batch.longest, batch.columns);  // the dataset pads a batch to its longest sample
  EXPECT_EQ(shorter, 1);
  EXPECT_EQ(squeezed->seen[3].indices, clean->seen[1].indices);
  ASSERT_TRUE(clean_model && squeezed_model);
  auto squeezed_params = squeezed_model->named_parameters();
  for (const auto& p : clean_model->named_parameters()) {
    EXPECT_LE((p.value() - squeezed_params[p.key()]).abs().max().item<double>(), 1e-6) << p.key();
  }
}

}  // namespace trainer
