// Data as users keep it: the datasets "csv" (CSV, TSV) and "npy" (numpy.save's arrays) on files
// NumPy and Python's csv module write (tests/data/array_files.py). Fashion-MNIST through either
// trains exactly as through the built-in dataset; regression and multilabel data train; a bad
// row is named with its file and line, a bad array with what it declares.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "support/test_util.h"
#include "trainer/data.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::metric_by_step;

std::string file(const std::string& name) { return std::string(TRAINER_ARRAY_FIXTURES) + "/" + name; }

constexpr const char* kRecipe = R"(
[run]
name = "arrays"
seed = 9
[model]
name = "mlp"
hidden = [32]
[training]
epochs = 2
batch_size = 64
log_every = 1
[optim]
name = "sgd"
lr = 0.05
momentum = 0.9
[eval]
every_epochs = 1
batch_size = 50
[runtime]
num_threads = 1
[metrics]
console = false
)";

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

/// The dataset `name` of the registry from the [dataset] keys `keys`, one split.
std::shared_ptr<Dataset> dataset(const std::string& keys, Split split = Split::Train) {
  const Config c = Config::parse("[dataset]\n" + keys);
  return dataset_registry().get(c.get<std::string>("dataset.name")).factory(c.sub("dataset"), split);
}

class ArrayDatasets : public testing::TrainerTest {
 protected:
  RunResult run(const std::string& name, const std::vector<std::string>& overrides) {
    std::shared_ptr<Model> model;
    const RunResult r = fit(kRecipe, overrides, name, {}, &model);
    params_.clear();
    if (model) {
      for (const auto& p : model->parameters()) params_.push_back(p.detach().clone());
    }
    return r;
  }
  std::map<long, double> losses(const std::string& run) {
    return metric_by_step(tmp_ / (run + "/metrics.jsonl"), "train/loss");
  }
  std::vector<at::Tensor> params_;
};

const std::vector<std::string> kFashion = {"dataset.name=\"fashion_mnist\"", "dataset.limit=512",
                                           "dataset.eval_limit=200"};
std::vector<std::string> npy_fashion() {
  return {"dataset.name=\"npy\"", "dataset.train_inputs=" + quoted(file("fmnist_train_x.npy")),
          "dataset.train_targets=" + quoted(file("fmnist_train_y.npy")),
          "dataset.test_inputs=" + quoted(file("fmnist_test_x.npy")),
          "dataset.test_targets=" + quoted(file("fmnist_test_y.npy"))};
}
std::vector<std::string> csv_fashion(const std::string& train) {
  return {"dataset.name=\"csv\"", "dataset.train=" + quoted(file(train)),
          "dataset.test=" + quoted(file("fmnist_test.csv")), "dataset.targets=[\"label\"]"};
}

// The same 512 images, the same numbers (NumPy saved what the built-in dataset computes, in
// .npy files and in a stored and a deflated .npz archive; the CSV holds each float32 exactly),
// shuffled by the same seed: the same run, bit for bit.
TEST_F(ArrayDatasets, FashionMnistFromNpyNpzCsvAndTsvTrainsAsTheBuiltInDataset) {
  ASSERT_EQ(run("builtin", kFashion).exit_code, kExitOk);
  const auto reference = losses("builtin");
  const auto params = params_;
  ASSERT_EQ(reference.size(), 16u);
  const std::vector<std::pair<std::string, std::vector<std::string>>> runs = {
      {"npy", npy_fashion()},
      {"npz",
       {"dataset.name=\"npz\"", "dataset.train=" + quoted(file("fmnist_train.npz")),
        "dataset.test=" + quoted(file("fmnist_test.npz")), "dataset.inputs=\"images\"", "dataset.targets=\"labels\""}},
      {"csv", csv_fashion("fmnist_train.csv")},
      {"tsv", csv_fashion("fmnist_train.tsv")}};
  for (const auto& [name, overrides] : runs) {
    SCOPED_TRACE(name);
    const RunResult r = run(name, overrides);
    ASSERT_EQ(r.exit_code, kExitOk) << r.message;
    EXPECT_EQ(losses(name), reference);
    ASSERT_EQ(params_.size(), params.size());
    for (std::size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params_[i], params[i])) << i;
    EXPECT_EQ(metric_by_step(tmp_ / (name + "/metrics.jsonl"), "eval/accuracy"),
              metric_by_step(tmp_ / "builtin/metrics.jsonl", "eval/accuracy"));
  }
}

TEST_F(ArrayDatasets, NpyReadsFortranOrderAndEveryIntegerAndFloatType) {
  const auto c_order = dataset("name = \"npy\"\ntrain_inputs = " + quoted(file("fmnist_train_x.npy")) +
                               "\ntrain_targets = " + quoted(file("fmnist_train_y.npy")) + "\n");
  const auto fortran = dataset("name = \"npy\"\ntrain_inputs = " + quoted(file("fortran_x.npy")) +
                               "\ntrain_targets = " + quoted(file("int32_y.npy")) + "\n");
  const at::Tensor idx = at::arange(16, at::kLong);
  const Batch a = c_order->get(idx), b = fortran->get(idx);
  EXPECT_TRUE(torch::equal(a.inputs, b.inputs));  // float64 of float32 values, back to float32: exact
  EXPECT_EQ(b.inputs.scalar_type(), at::kFloat);
  EXPECT_EQ(b.targets.scalar_type(), at::kLong);  // int32 labels are class indices
  EXPECT_TRUE(torch::equal(a.targets, b.targets));
  EXPECT_EQ(fortran->spec().sample_shape, (std::vector<std::int64_t>{1, 28, 28}));
  const auto raw = dataset("name = \"npy\"\ntrain_inputs = " + quoted(file("uint8_x.npy")) +
                           "\ntrain_targets = " + quoted(file("int32_y.npy")) + "\nnum_classes = 10\n");
  EXPECT_EQ(raw->spec().num_classes, 10);
  EXPECT_EQ(raw->get(idx).inputs.max().item<float>(), 255.0f);  // pixels as they are, as float32
  // Boolean labels are 0/1 floats.
  const auto labels = dataset("name = \"npy\"\ntrain_inputs = " + quoted(file("labels_train_x.npy")) +
                              "\ntrain_targets = " + quoted(file("labels_train_y.npy")) + "\n");
  EXPECT_EQ(labels->get(idx).targets.scalar_type(), at::kFloat);
  EXPECT_EQ(labels->get(idx).targets.sizes(), (std::vector<std::int64_t>{16, 4}));
  EXPECT_EQ(labels->spec().num_classes, 0);
}

TEST_F(ArrayDatasets, RegressionFromCsvAndMultilabelFromNpyTrain) {
  const RunResult reg =
      run("regression", {"dataset.name=\"csv\"", "dataset.train=" + quoted(file("regression_train.csv")),
                         "dataset.test=" + quoted(file("regression_test.csv")), "dataset.targets=[\"y0\", \"y1\"]",
                         "task.name=\"regression\"", "training.epochs=8", "optim.lr=0.02"});
  ASSERT_EQ(reg.exit_code, kExitOk) << reg.message;
  EXPECT_GT(reg.final_metrics.at("eval/r2"), 0.95);
  const RunResult ml =
      run("multilabel", {"dataset.name=\"npy\"", "dataset.train_inputs=" + quoted(file("labels_train_x.npy")),
                         "dataset.train_targets=" + quoted(file("labels_train_y.npy")),
                         "dataset.test_inputs=" + quoted(file("labels_test_x.npy")),
                         "dataset.test_targets=" + quoted(file("labels_test_y.npy")), "task.name=\"multilabel\"",
                         "training.epochs=8"});
  ASSERT_EQ(ml.exit_code, kExitOk) << ml.message;
  EXPECT_GT(ml.final_metrics.at("eval/micro_f1"), 0.85);
  EXPECT_GT(ml.final_metrics.at("eval/map"), 0.9);
}

// A run stopped after 5 steps and resumed goes on at the next sample, as the run that did not
// stop: the shuffled order of a CSV dataset is the run's.
TEST_F(ArrayDatasets, AResumedCsvRunGoesOnAtTheNextSample) {
  ASSERT_EQ(run("straight", csv_fashion("fmnist_train.csv")).exit_code, kExitOk);
  auto part = csv_fashion("fmnist_train.csv");
  part.push_back("training.max_steps=5");
  ASSERT_EQ(run("part", part).exit_code, kExitOk);
  TrainerOptions o = options_for(kRecipe, csv_fashion("fmnist_train.csv"), "resumed");
  o.resume = tmp_ / "part";
  ASSERT_EQ(Trainer(std::move(o)).fit().exit_code, kExitOk);
  const auto straight = losses("straight"), resumed = losses("resumed");
  ASSERT_EQ(resumed.size(), 11u);
  for (const auto& [step, v] : resumed) EXPECT_EQ(v, straight.at(step)) << step;
}

TEST_F(ArrayDatasets, CsvReadsByteOrderMarksCrlfBlankLinesAndNegativeWholeNumbers) {
  const auto bom = dataset("name = \"csv\"\ntrain = " + quoted(file("bom.csv")) + "\ntargets = [\"y\"]\n");
  ASSERT_EQ(bom->size(), 2);
  const Batch b = bom->get(at::arange(2, at::kLong));
  EXPECT_TRUE(torch::equal(b.inputs, at::tensor({1.f, 2.f, 3.f, 4.f}).reshape({2, 2})));
  EXPECT_TRUE(torch::equal(b.targets, at::tensor({0, 1}, at::kLong)));
  EXPECT_EQ(bom->spec().num_classes, 2);
  // Whole numbers below 0 are values (a regression's), not classes.
  const auto counts = dataset("name = \"csv\"\ntrain = " + quoted(file("counts.csv")) + "\ntargets = [\"y\"]\n");
  EXPECT_EQ(counts->spec().num_classes, 0);
  EXPECT_TRUE(torch::equal(counts->get(at::arange(3, at::kLong)).targets, at::tensor({-3, 4, -1}, at::kLong)));
}

// The test split's classes are the training split's: a class beyond them, after the first
// samples the task looks at before training, fails the evaluation with exit code 2 naming it.
TEST_F(ArrayDatasets, ATestClassTheTrainingSplitLacksIsNamed) {
  const RunResult r = run("unseen", {"dataset.name=\"csv\"", "dataset.train=" + quoted(file("three_train.csv")),
                                     "dataset.test=" + quoted(file("unseen_test.csv")), "dataset.targets=[\"y\"]"});
  EXPECT_EQ(r.exit_code, kExitUsage) << r.message;
  EXPECT_NE(r.message.find("an evaluated sample has the class 5; the model has 3 classes"), std::string::npos)
      << r.message;
}

struct Bad {
  std::vector<std::string> overrides;
  std::string says;
};
/// A .npy file (format 1.0) of int64 values of the shape `shape` ("2," or "2, 1"), as numpy.save
/// writes one.
void write_int64_npy(const std::string& path, const std::vector<std::int64_t>& values, const std::string& shape) {
  std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (" + shape + "), }";
  header.resize((header.size() + 10 + 1 + 63) / 64 * 64 - 10 - 1, ' ');  // the data starts at a multiple of 64
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + char(header.size()) + '\0' + header;
  bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(std::int64_t));
  testing::write_file(path, bytes);
}

// A class index is what the data can mean: without dataset.num_classes, below max(samples, 1024).
// Beyond it (a 39-byte file made a 400-million-class head), classification is refused naming the
// file, the line (an array: the index) and the value, and the key that sets the classes; a
// regression reads the same numbers as values. memory.limit_mb keeps a run that would build such
// a head from taking the machine's memory.
TEST_F(ArrayDatasets, AClassIndexBeyondWhatTheSamplesCanMeanIsRefusedNamingFileLineAndValue) {
  const auto csv = [&](const std::string& name, const std::string& target) {
    testing::write_file(tmp_ / name, "x,y\n1,0\n2," + target + "\n");
    return std::vector<std::string>{"dataset.name=\"csv\"",    "dataset.train=" + quoted(tmp_ / name),
                                    "dataset.targets=[\"y\"]", "eval.every_epochs=0",
                                    "eval.at_end=false",       "memory.limit_mb=512"};
  };
  write_int64_npy(tmp_ / "x.npy", {1, 2}, "2, 1");
  write_int64_npy(tmp_ / "y.npy", {0, INT64_MAX}, "2,");
  const std::vector<std::string> npy = {"dataset.name=\"npy\"",
                                        "dataset.train_inputs=" + quoted(tmp_ / "x.npy"),
                                        "dataset.train_targets=" + quoted(tmp_ / "y.npy"),
                                        "eval.every_epochs=0",
                                        "eval.at_end=false",
                                        "memory.limit_mb=512"};
  const std::vector<Bad> cases = {
      {csv("big.csv", "400000000"), "dataset.train = \"" + (tmp_ / "big.csv") +
                                        "\" line 3: the target 400000000 is not a class index 2 samples can mean "
                                        "(without dataset.num_classes, class indices are below max(samples, 1024) = "
                                        "1024); if there are that many classes, set dataset.num_classes"},
      {csv("max.csv", "9223372036854775807"),
       "dataset.train = \"" + (tmp_ / "max.csv") +
           "\" line 3: the target 9.223372036854776e+18 is a whole number too large to be a class index"},
      {npy, "dataset.train_targets = \"" + (tmp_ / "y.npy") +
                "\", element 1: the target 9223372036854775807 is not a class index 2 samples can mean"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].says);
    const RunResult r = run("big" + std::to_string(i), cases[i].overrides);
    EXPECT_EQ(r.exit_code, kExitUsage) << r.message;
    EXPECT_NE(r.message.find(cases[i].says), std::string::npos) << r.message;
  }
  // The same numbers are a regression's values; dataset.num_classes says there are more classes.
  auto regression = csv("values.csv", "5000");
  regression.insert(regression.end(), {"task.name=\"regression\"", "optim.lr=1e-9"});
  EXPECT_EQ(run("values", regression).exit_code, kExitOk);
  testing::write_file(tmp_ / "many.csv", "x,y\n1,0\n2,1500\n");
  EXPECT_EQ(
      dataset("name = \"csv\"\ntrain = " + quoted(tmp_ / "many.csv") + "\ntargets = [\"y\"]\nnum_classes = 2000\n")
          ->spec()
          .num_classes,
      2000);
}

TEST_F(ArrayDatasets, WithoutNumClassesTheClassesAreBelowMaxOfSamplesAnd1024) {
  const auto classes = [&](const std::string& target) {
    testing::write_file(tmp_ / "c.csv", "x,y\n1,0\n2," + target + "\n");
    return dataset("name = \"csv\"\ntrain = " + quoted(tmp_ / "c.csv") + "\ntargets = [\"y\"]\n")->spec();
  };
  EXPECT_EQ(classes("1023").num_classes, 1024);
  EXPECT_TRUE(classes("1023").classes_refused.empty());
  EXPECT_EQ(classes("1024").num_classes, 0);
  EXPECT_NE(classes("1024").classes_refused.find("c.csv\" line 3: the target 1024"), std::string::npos);
  // Float targets that are not whole, and negative whole numbers, are values: nothing is refused.
  EXPECT_TRUE(classes("0.5").classes_refused.empty());
  EXPECT_TRUE(classes("-400000000").classes_refused.empty());
}

TEST_F(ArrayDatasets, BadFilesExitTwoNamingFileLineAndWhatIsAllowed) {
  const auto csv = [](const std::string& name, const std::string& targets = "[\"y\"]") {
    return std::vector<std::string>{"dataset.name=\"csv\"", "dataset.train=" + quoted(file(name)),
                                    "dataset.targets=" + targets, "eval.every_epochs=0", "eval.at_end=false"};
  };
  const auto npz = [](const std::string& archive) {
    return std::vector<std::string>{"dataset.name=\"npz\"", "dataset.train=" + quoted(file(archive)),
                                    "eval.every_epochs=0", "eval.at_end=false"};
  };
  const auto npy = [](const std::string& x, const std::string& y) {
    return std::vector<std::string>{"dataset.name=\"npy\"", "dataset.train_inputs=" + quoted(file(x)),
                                    "dataset.train_targets=" + quoted(file(y)), "eval.every_epochs=0",
                                    "eval.at_end=false"};
  };
  const std::vector<Bad> cases = {
      {csv("bad_number.csv"), file("bad_number.csv") + " line 4, column 'b': 'abc' is not a finite number"},
      {csv("bad_empty.csv"), file("bad_empty.csv") + " line 2, column 'b': an empty field is not a finite number"},
      {csv("bad_fields.csv"), file("bad_fields.csv") + " line 3: 2 fields; the header has 3"},
      {csv("bad_quote.csv"),
       file("bad_quote.csv") + " line 2: a quoted field is not closed before the end of the file"},
      {csv("regression_test.csv", "[\"label\"]"), "dataset.targets: no column 'label' in " +
                                                      file("regression_test.csv") +
                                                      "; its columns are x0, x1, x2, x3, x4, x5, x6, x7, y0, y1"},
      {csv("bad_header_only.csv"), "dataset.train = \"" + file("bad_header_only.csv") + "\": no rows after its header"},
      {csv("missing.csv"), "dataset.train = \"" + file("missing.csv") + "\": no such file"},
      {{"dataset.name=\"csv\"", "dataset.train=" + quoted(file("regression_train.csv")), "dataset.targets=[\"y0\"]"},
       "dataset.test is empty: the run evaluates"},
      {npy("bad_truncated.npy", "int32_y.npy"),
       "bad_truncated.npy\": shape (3, 4) of <f4 is 48 bytes of data; the "
       "file has 44 (truncated?)"},
      {npy("bad_bigendian.npy", "int32_y.npy"), "big-endian dtype '>f4'; save it little-endian (astype('<f4'))"},
      {npy("bad_object.npy", "int32_y.npy"), "dtype '|O'; read here: float16/32/64, int8/16/32/64, uint8, bool"},
      {npy("bad_complex.npy", "int32_y.npy"), "dtype '<c8'"},
      {npy("bad_archive.npz", "int32_y.npy"),
       "not a .npy file (numpy.save writes one; for an .npz archive use "
       "dataset.name = \"npz\")"},
      {npz("bad_archive.npz"), "bad_archive.npz\": no array 'y' (dataset.targets); it holds x.npy"},
      {npz("bad_bomb.npz"), "declares 2147483632 bytes inflated from"},
      {npz("bad_damaged.npz"), "does not inflate to the"},
      {npz("fmnist_test_x.npy"),
       "not a zip archive (numpy.savez writes one; for a single array use "
       "dataset.name = \"npy\")"},
      {npy("uint8_x.npy", "bad_count_y.npy"),
       "holds 16 samples, dataset.train_targets = \"" + file("bad_count_y.npy") + "\" 5 targets"},
      // The data does not fit the task: float targets for classification.
      {{"dataset.name=\"csv\"", "dataset.train=" + quoted(file("regression_train.csv")), "dataset.targets=[\"y0\"]",
        "eval.every_epochs=0", "eval.at_end=false"},
       "task.name = \"classification\": the dataset's targets are Float of shape [8] (per batch); classification "
       "needs integer class indices"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].says);
    const RunResult r = run("bad" + std::to_string(i), cases[i].overrides);
    EXPECT_EQ(r.exit_code, kExitUsage) << r.message;
    EXPECT_NE(r.message.find(cases[i].says), std::string::npos) << r.message;
  }
}

}  // namespace
}  // namespace trainer
