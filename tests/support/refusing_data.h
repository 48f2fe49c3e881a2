#pragma once
// A data set whose chosen read runs out of memory for real, for tests of the recovery from an
// out-of-memory error while reading a batch (in the step, in a loader worker, in an evaluation).
#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "trainer/data.h"
#include "trainer/memory.h"

namespace trainer::testing {

/// `base`, but its `at`-th get() (counted from 1, over every thread that reads it) sets the
/// CPU budget to what is in use plus `headroom` bytes and asks for `bytes`, which the budget
/// refuses; the budget is lifted again and the out-of-memory error thrown. Every other read is
/// `base`'s.
class RefusingData final : public Dataset {
 public:
  RefusingData(std::shared_ptr<Dataset> base, int at, std::int64_t headroom, std::int64_t bytes)
      : base_(std::move(base)), at_(at), headroom_(headroom), bytes_(bytes) {}
  std::int64_t size() const override { return base_->size(); }
  DataSpec spec() const override { return base_->spec(); }
  Batch get(const at::Tensor& idx) const override {
    if (calls_.fetch_add(1) + 1 == at_) {
      const c10::Device cpu(c10::kCPU);
      set_memory_limit(cpu, memory_stats(cpu).allocated + headroom_);
      try {
        auto big = at::empty({bytes_}, at::kByte);
      } catch (...) {
        set_memory_limit(cpu, 0);
        throw;
      }
      set_memory_limit(cpu, 0);
    }
    return base_->get(idx);
  }

  /// Registers `name`: the data set `like` (a registered name), its split `split` refusing as above.
  static void add(const std::string& name, const std::string& like, Split split, int at, std::int64_t headroom,
                  std::int64_t bytes) {
    auto base = dataset_registry().get(like);
    dataset_registry().add(
        name,
        [base, split, at, headroom, bytes](const Config& c, Split s) -> std::shared_ptr<Dataset> {
          auto ds = base.factory(c, s);
          return s == split ? std::make_shared<RefusingData>(ds, at, headroom, bytes) : ds;
        },
        base.keys);
  }

 private:
  std::shared_ptr<Dataset> base_;
  int at_;
  std::int64_t headroom_, bytes_;
  mutable std::atomic<int> calls_{0};  // a loader worker's reads and the step's own
};

}  // namespace trainer::testing
