#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "trainer/config.h"
#include "trainer/export.h"
#include "trainer/model.h"
#include "trainer/registry.h"

namespace trainer {

/// A batch of samples: inputs [N, ...] float32 (cast to the model's dtype on the device), or
/// integer token ids for a model that takes them (model "bert": [N, L], [N, 2, L] or [N, 3, L],
/// kept integers), and the targets the task reads (trainer/task.h).
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
  std::int64_t size() const { return targets.defined() ? targets.size(0) : 0; }
};

enum class Split { Train, Test };

/// A random-access dataset. get() and get_in_epoch() are called from the loader's worker
/// threads, several at once: they must not change shared state (read-only members, or their
/// own locking).
class TRAINER_API Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of samples.
  virtual std::int64_t size() const = 0;
  /// Samples at `indices` (1-D int64) in that order, as evaluated: no random augmentation, the
  /// same every call.
  virtual Batch get(const at::Tensor& indices) const = 0;
  /// Samples at `indices` as trained on in epoch `epoch`: a dataset that augments at random
  /// draws each sample's augmentation from (its seed, `epoch`, the sample's index) alone, so a
  /// batch is the same whichever thread reads it and whenever. The default is get(indices).
  virtual Batch get_in_epoch(const at::Tensor& indices, std::int64_t epoch) const {
    (void)epoch;
    return get(indices);
  }
  /// Sample shape and class count.
  virtual DataSpec spec() const = 0;
  /// Each sample's length ([size()] int64: tokens, for a text dataset), which decides the width
  /// of the batch it joins: training.group_by_length batches samples of similar length. The
  /// default, undefined, is a dataset whose samples have no length.
  virtual at::Tensor lengths() const { return {}; }
};

/// Builds a dataset split from its config section (`dataset.*`).
using DatasetFactory = std::function<std::shared_ptr<Dataset>(const Config& section, Split split)>;

/// The process-wide dataset registry (built-ins: "fashion_mnist", "synthetic").
TRAINER_API Registry<DatasetFactory>& dataset_registry();

/// Reads one IDX file (optionally gzip-compressed) into a uint8 tensor of its dimensions.
/// Throws trainer::Error naming the file on a bad magic number or a short read.
TRAINER_API at::Tensor read_idx_file(const std::string& path);

/// Restricts a dataset to its first `limit` samples (limit <= 0: unchanged).
TRAINER_API std::shared_ptr<Dataset> limit_dataset(std::shared_ptr<Dataset> ds, std::int64_t limit);

}  // namespace trainer
