// The task "masked_lm": masked language modelling as transformers' BertForMaskedLM computes its
// loss: cross-entropy of the logits of every masked token against the token it hid, averaged
// over the batch's masked tokens (the targets are -100 where nothing is masked). The batch's
// loss weighs each sample by its masked tokens (Task::sample_weights), so that it is the same
// however the batch is split into micro-batches or ranks.
#include "task/masked_lm.h"

#include <ATen/ATen.h>

#include <cmath>

#include "task/task_common.h"
#include "trainer/error.h"

namespace trainer::detail {

namespace {

/// What transformers' labels hold where no token is masked (CrossEntropyLoss's ignore_index).
constexpr std::int64_t kIgnored = -100;

class MaskedLm final : public Task {
 public:
  MaskedLm(const DataSpec& data, const Batch& probe) : vocab_(data.token_id_limit) {
    const auto refused = [&] { return refusal("masked_lm", probe); };
    TRAINER_CHECK_T(UsageError,
                    vocab_ > 0 && (probe.inputs.dim() == 2 || probe.inputs.dim() == 3) && probe.targets.dim() == 2,
                    refused(),
                    "; masked language modelling needs the tokens a text dataset hides: dataset.name = \"text\" with "
                    "dataset.masked_lm = true");
    TRAINER_CHECK_T(UsageError, probe.targets.scalar_type() == at::kLong, refused(), "; it needs int64 token ids");
    TRAINER_CHECK_T(UsageError, probe.targets.size(1) == probe.inputs.size(-1), refused(),
                    "; it needs one target per input token (", probe.inputs.size(-1), ")");
    const at::Tensor real = probe.targets.ne(kIgnored);
    if (real.any().item<bool>()) {
      const at::Tensor t = probe.targets.masked_select(real);
      const auto lo = t.min().item<std::int64_t>(), hi = t.max().item<std::int64_t>();
      TRAINER_CHECK_T(UsageError, lo >= 0 && hi < vocab_, refused(), " with a target of ", lo < 0 ? lo : hi,
                      "; a target is a token id below ", vocab_, " (the tokenizer's), or -100 where nothing is masked");
    }
  }

  std::int64_t outputs() const override { return vocab_; }
  bool token_outputs() const override { return true; }

  at::Tensor sample_losses(const at::Tensor& outputs, const at::Tensor& targets) const override {
    const at::Tensor t = cut(targets, outputs);
    const at::Tensor tokens = token_losses(outputs, t);  // [N, L], 0 where nothing is masked
    return tokens.sum(1) / t.ne(kIgnored).sum(1).clamp_min(1).to(tokens.scalar_type());
  }

  at::Tensor mean_loss(const at::Tensor& outputs, const at::Tensor& targets) const override {
    const at::Tensor t = cut(targets, outputs);
    const at::Tensor sum =
        at::cross_entropy_loss(widened(outputs).flatten(0, 1), t.flatten(), {}, at::Reduction::Sum, kIgnored, 0.0);
    return sum / t.ne(kIgnored).sum().clamp_min(1).to(sum.scalar_type());
  }

  at::Tensor sample_weights(const at::Tensor& targets) const override { return targets.ne(kIgnored).sum(1); }

  /// [correctly predicted masked tokens, masked tokens]
  std::int64_t train_width() const override { return 2; }
  at::Tensor train_sums(const at::Tensor& outputs, const at::Tensor& targets) const override {
    const at::Tensor t = cut(targets, outputs, /*check=*/false);  // mean_loss() checked these
    const at::Tensor masked = t.ne(kIgnored);
    return at::stack({outputs.argmax(2).eq(t).logical_and(masked).sum(), masked.sum()});
  }
  std::map<std::string, double> train_metrics(const at::Tensor& sums, std::int64_t) const override {
    const double masked = sums[1].item<double>();
    return {{"accuracy", masked > 0 ? sums[0].item<double>() / masked : 0.0}};
  }

  /// [loss (the mean over the sample's masked tokens), masked tokens, correctly predicted ones]
  std::int64_t eval_width() const override { return 3; }
  at::Tensor eval_rows(const at::Tensor& outputs, const at::Tensor& targets) const override {
    const at::Tensor t = cut(targets, outputs);
    const at::Tensor masked = t.ne(kIgnored);
    return at::stack({sample_losses(outputs, t).to(at::kDouble), masked.sum(1).to(at::kDouble),
                      outputs.argmax(2).eq(t).logical_and(masked).sum(1).to(at::kDouble)},
                     1);
  }

  /// The loss is the mean over every masked token (not over samples), as in training; its
  /// exponential is the perplexity; accuracy is over masked tokens.
  std::map<std::string, double> evaluate(const at::Tensor& rows) const override {
    const auto r = rows.accessor<double, 2>();
    double loss = 0, masked = 0, correct = 0;
    for (std::int64_t i = 0; i < rows.size(0); ++i) {
      loss += r[i][0] * r[i][1];
      masked += r[i][1];
      correct += r[i][2];
    }
    const double mean = masked > 0 ? loss / masked : 0.0;
    return {{"loss", mean},
            {"perplexity", std::exp(mean)},
            {"accuracy", masked > 0 ? correct / masked : 0.0},
            {"masked_tokens", masked}};
  }

 private:
  /// The targets of the positions the model computed: a model may cut a batch's padding
  /// (model "bert" computes up to the last attended token), where nothing is masked. `check`:
  /// that no target is cut off (one read of the device).
  at::Tensor cut(const at::Tensor& targets, const at::Tensor& outputs, bool check = true) const {
    TRAINER_CHECK_T(UsageError, targets.dim() == 2 && outputs.size(0) == targets.size(0), "task masked_lm: outputs ",
                    outputs.sizes(), " for targets ", targets.sizes());
    const std::int64_t l = outputs.size(1), width = targets.size(1);
    TRAINER_CHECK_T(UsageError, l <= width, "task masked_lm: the model gave ", l, " rows per sample for inputs of ",
                    width, " tokens");
    if (l == width) return targets;
    TRAINER_CHECK_T(UsageError, !check || targets.narrow(1, l, width - l).eq(kIgnored).all().item<bool>(),
                    "task masked_lm: the model gave ", l, " rows per sample for inputs of ", width,
                    " tokens, and a token it left out is masked");
    return targets.narrow(1, 0, l);
  }

  at::Tensor token_losses(const at::Tensor& outputs, const at::Tensor& t) const {
    const at::Tensor flat =
        at::cross_entropy_loss(widened(outputs).flatten(0, 1), t.flatten(), {}, at::Reduction::None, kIgnored, 0.0);
    return flat.view({t.size(0), t.size(1)});
  }

  std::int64_t vocab_;
};

}  // namespace

std::unique_ptr<Task> masked_lm_task(const DataSpec& data, const Batch& probe) {
  return std::make_unique<MaskedLm>(data, probe);
}

}  // namespace trainer::detail
