// The package-description corpus (scripts/apt_corpus.py) on this machine's apt lists and on
// package records written here: deduplicated, split by package name, sections as labels; its
// tokenizer.json reads in trainer as in Hugging Face's tokenizers; recipes/text_classification.toml
// trains on it.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "support/test_util.h"
#include "text/tokenizer.h"
#include "trainer/data.h"

namespace trainer {
namespace {

using testing::read_file;
using testing::run_command;
using testing::TempDir;
using testing::write_file;

const std::string kCorpus = TRAINER_APT_CORPUS;
const std::string kScript = std::string("/usr/bin/python3 ") + TRAINER_SOURCE_DIR + "/scripts/apt_corpus.py ";

/// The lines of a file (a CSV file the script wrote: no field of these tests' records holds a
/// line break), without their "\r".
std::vector<std::string> rows_of(const std::string& path) {
  std::vector<std::string> rows;
  const std::string text = read_file(path);
  for (std::size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1) {
    rows.push_back(text.substr(at, end - at));
    if (!rows.back().empty() && rows.back().back() == '\r') rows.back().pop_back();
  }
  return rows;
}

TEST(AptCorpus, DescriptionsAreDeduplicatedSplitByPackageAndLabelledBySection) {
  TempDir tmp;
  write_file(tmp / "Packages",
             "Package: alpha\nSection: libs\nDescription: X library\n long text\n .\n more\n\n"
             "Package: beta\nSection: libs\nDescription: X library\n\n"
             "Package: gamma\nSection: contrib/net\nDescription: Net tool\n\n"
             "Package: delta\nSection: python\nDescription: Shared text\n\n"
             "Package: eps\nSection: perl\nDescription: Shared text\n\n"
             "Package: zeta\nSection: net\nDescription: Another net tool\n\n"
             "Package: nodesc\nSection: net\n\n");
  const auto r = run_command(kScript + (tmp / "out") + " --packages " + (tmp / "Packages") + " --min-per-class 1");
  ASSERT_EQ(r.code, 0) << r.text;
  std::vector<std::string> all = rows_of(tmp / "out/train.csv");
  const auto test = rows_of(tmp / "out/test.csv");
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front(), "package,text,label");
  EXPECT_EQ(test.front(), "package,text,label");
  all.insert(all.end(), test.begin() + 1, test.end());
  const std::multiset<std::string> rows(all.begin() + 1, all.end());
  // One "X library" (under the first name), none of the two sections of "Shared text", the
  // component left out of the section, a package without a description left out.
  EXPECT_EQ(rows,
            (std::multiset<std::string>{"alpha,X library,libs", "gamma,Net tool,net", "zeta,Another net tool,net"}));
  const std::string summary = read_file(tmp / "out/corpus.json");
  EXPECT_NE(summary.find("\"packages_read\": 7"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"conflicting_sections_left_out\": 1"), std::string::npos) << summary;
  // The same input, the same files: the split depends on the names alone.
  ASSERT_EQ(run_command(kScript + (tmp / "again") + " --packages " + (tmp / "Packages") + " --min-per-class 1").code,
            0);
  EXPECT_EQ(read_file(tmp / "again/train.csv"), read_file(tmp / "out/train.csv"));
  EXPECT_EQ(read_file(tmp / "again/test.csv"), read_file(tmp / "out/test.csv"));
  // A class with fewer training texts than --min-per-class is left out.
  ASSERT_EQ(run_command(kScript + (tmp / "min") + " --packages " + (tmp / "Packages") + " --min-per-class 2").code, 0);
  const std::string kept = read_file(tmp / "min/train.csv") + read_file(tmp / "min/test.csv");
  EXPECT_EQ(kept.find("libs"), std::string::npos) << kept;
  // No records: said.
  write_file(tmp / "empty", "\n");
  const auto none = run_command(kScript + (tmp / "none") + " --packages " + (tmp / "empty"));
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.text.find("no package records"), std::string::npos) << none.text;
}

TEST(AptCorpus, ThisMachinesListsGiveARealTaskAndItsTokenizerReadsAsHuggingFaceReadsIt) {
  const auto train = rows_of(kCorpus + "/train.csv"), test = rows_of(kCorpus + "/test.csv");
  EXPECT_GE(train.size(), 10000u);
  EXPECT_GE(test.size(), 1000u);
  const std::string summary = read_file(kCorpus + "/corpus.json");
  const auto ds = [&](const char* file) {
    const Config c = Config::parse("[dataset]\nname = \"text\"\ntrain = \"" + kCorpus + "/" + file +
                                   "\"\ntokenizer = \"" + kCorpus + "\"\nmax_length = 64\n");
    return dataset_registry().get("text").factory(c.sub("dataset"), Split::Train);
  };
  const auto data = ds("train.csv");
  EXPECT_EQ(data->size(), static_cast<std::int64_t>(train.size()) - 1);
  EXPECT_GE(data->spec().num_classes, 10);
  // Every test text encodes as tokenizers encodes it with the file the script wrote.
  const auto expected = rows_of(kCorpus + "/expected.txt");
  const auto tok = text::Tokenizer::from_file(kCorpus + "/tokenizer.json");
  const auto texts = rows_of(kCorpus + "/texts.txt");
  ASSERT_EQ(texts.size(), expected.size());
  ASSERT_GE(texts.size(), 1000u);
  int wrong = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const auto e = tok.encode(texts[i]);
    std::string got;
    for (std::size_t k = 0; k < e.ids.size(); ++k) got += (k ? " " : "") + std::to_string(e.ids[k]);
    if (got != expected[i] && ++wrong <= 5) ADD_FAILURE() << texts[i] << "\n  got " << got << "\n  hf  " << expected[i];
  }
  EXPECT_EQ(wrong, 0);
}

TEST(AptCorpus, TheTextClassificationRecipeTrainsOnIt) {
  TempDir tmp;
  const auto r =
      run_command(std::string(TRAINER_CLI) + " --recipe " + TRAINER_SOURCE_DIR +
                  "/recipes/text_classification.toml dataset.train=\\\"" + kCorpus +
                  "/train.csv\\\" dataset.test=\\\"" + kCorpus + "/test.csv\\\" dataset.tokenizer=\\\"" + kCorpus +
                  "\\\" training.max_steps=300 sched.warmup_steps=20 eval.at_end=true eval.every_epochs=0 "
                  "'plugins.load=[\"mlflow\"]' '+plugins.mlflow.tracking_uri=\"file://" +
                  (tmp / "mlruns") + "\"' --log-level warn --run-dir " + (tmp / "run"));
  ASSERT_EQ(r.code, 0) << r.text;
  const auto accuracy = testing::metric_by_step(tmp / "run/metrics.jsonl", "eval/accuracy");
  ASSERT_EQ(accuracy.size(), 1u);
  // 300 steps of 64 texts: twice the largest class's share (libs, about 11 %), 0.40 on the machine that wrote this.
  EXPECT_GT(accuracy.begin()->second, 0.2);

  // The run in MLflow's file store: its evaluation and its model's name.
  int runs = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(tmp / "mlruns")) {
    if (f.path().filename() != "accuracy" || f.path().parent_path().filename() != "eval") continue;
    ++runs;
    const std::string metric = read_file(f.path().string());
    EXPECT_NE(metric.find(" 300\n"), std::string::npos) << metric;  // <time> <value> <step>
    const auto run = f.path().parent_path().parent_path().parent_path();
    EXPECT_EQ(read_file((run / "params/model.name").string()), "bert");
  }
  EXPECT_EQ(runs, 1);
  // trainer report draws the run.
  const auto page = run_command(std::string(TRAINER_CLI) + " report " + (tmp / "run"));
  ASSERT_EQ(page.code, 0) << page.text;
  const std::string html = read_file(tmp / "run/report.html");
  EXPECT_NE(html.find("eval/accuracy"), std::string::npos);
  EXPECT_NE(html.find("train/loss"), std::string::npos);
}

}  // namespace
}  // namespace trainer
