// libFuzzer target for the study journal (STUDY/study.jsonl) as `trainer sweep` reads it on a
// resume, which is untrusted input (a study directory may come from anyone): the lines read
// back (StudyJournal::read, a cut last line left out), each record checked and replayed
// (replay), and the study record found compared with this study's (study_differences). Out
// come the trials to resume, or a UsageError naming each bad record by its line (or another
// trainer::Error, a file that cannot be read): the expected outcomes. Anything else (a crash, a
// hang, a sanitizer finding, a leak, any other exception such as nlohmann::json's) is a
// finding.
//
// An input is the journal's bytes. The search space is that of the seeds
// (tests/fuzz/corpus_study_journal, journals of real studies over it): a choice of model, a
// batch size conditioned on it, a log-uniform learning rate and an int, so that the trial
// records of the seeds are checked against the space they were sampled from.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "study_journal.h"
#include "sweep.h"
#include "trainer/config.h"
#include "trainer/error.h"

namespace {

/// The [sweep.space] of the seeds' studies.
const char* const kSpace = R"(
[sweep.space.model]
type = "choice"
values = ["mlp", "cnn"]
[sweep.space.training.batch_size]
type = "choice"
values = [32, 64]
condition_on = "model"
[sweep.space.training.batch_size.cases.cnn]
values = [16]
[sweep.space.optim.lr]
type = "log_uniform"
low = 1e-4
high = 1e-2
[sweep.space.training.max_steps]
type = "int"
low = 1
high = 3
)";

const trainer::tune::SearchSpace& space() {
  static const trainer::tune::SearchSpace s = trainer::tune::SearchSpace::from_config(
      trainer::Config::parse(kSpace, "fuzz.toml").sub("sweep.space"), "fuzz.toml");
  return s;
}

/// This study's record, as a resume compares the journal's with it.
const nlohmann::json& this_study() {
  static const nlohmann::json s{{"event", "study"},
                                {"version", trainer::tune::kStudyRecordVersion},
                                {"recipe", "/tmp/study.toml"},
                                {"config_hash", trainer::tune::config_hash("")},
                                {"config", {{"training.epochs", "1"}}},
                                {"overrides", {"sweep.n_trials=4", "training.max_steps=2"}},
                                {"objective", "eval/accuracy"},
                                {"direction", "maximize"},
                                {"sampler", "random"},
                                {"seed", 42},
                                {"n_trials", 4},
                                {"settings", {{"sweep.pruner", "none"}, {"sweep.budget_steps", 0}}},
                                {"space", trainer::tune::space_record(space())}};
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // `trainer sweep` reads the journal from its file.
  static const std::string path = "/tmp/trainer-study-journal-fuzz-" + std::to_string(::getpid()) + ".jsonl";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const trainer::tune::Replayed past = trainer::tune::replay(trainer::tune::StudyJournal(path).read(), space(), path);
    if (!past.study.is_null()) (void)trainer::tune::study_differences(past.study, this_study());
    for (const auto& [n, t] : past.trials) (void)t.params.overrides();  // what the trial runs with
  } catch (const trainer::Error&) {
    // A journal refused, naming its bad records (UsageError), or a file that cannot be read:
    // the expected outcomes.
  }
  return 0;
}
