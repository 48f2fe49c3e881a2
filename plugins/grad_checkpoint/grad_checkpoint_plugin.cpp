// grad_checkpoint: activation checkpointing per block. In ModelCreated it wraps every N-th block
// the model exposes (Model::blocks()) so that the block keeps only its input in the forward
// and recomputes the rest in backward (trainer::checkpoint_block: same dropout masks, same
// autocast state). Memory for activations drops to about one block's plus the blocks' inputs;
// each wrapped block's forward runs twice.
#include <spdlog/spdlog.h>

#include "trainer/activation_checkpoint.h"
#include "trainer/error.h"
#include "trainer/plugin.h"
#include "trainer/settings.h"

namespace {

struct GradCheckpointSettings : trainer::Settings<GradCheckpointSettings> {
  std::int64_t every = 1;

  static void declare(trainer::SettingsSchema<GradCheckpointSettings>& s) {
    s.add(&GradCheckpointSettings::every, "every",
          "Checkpoint every N-th block, counting from the first: 1 = all blocks, 2 = blocks 0, 2, 4, ...")
        .min(1);
  }
};

class GradCheckpointPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "grad_checkpoint"; }
  std::string description() const override {
    return "Activation checkpointing: recompute every N-th block in backward instead of keeping its activations";
  }
  std::vector<trainer::Event> events() const override { return {trainer::Event::ModelCreated}; }
  std::vector<trainer::KeySpec> config_keys() const override { return GradCheckpointSettings::keys(); }
  // A model without blocks is a usage error (exit code 2): the run would not get the memory it
  // was configured to save.
  trainer::FailurePolicy default_policy() const override { return trainer::FailurePolicy::Essential; }
  // After plugins that replace the model in ModelCreated: it wraps the blocks of the final one.
  int default_priority() const override { return 100; }

  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    s_ = GradCheckpointSettings::from(section);
  }

  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    const auto blocks = ctx.model->blocks();
    const std::string model = ctx.config->get<std::string>("model.name");
    TRAINER_CHECK_T(
        trainer::UsageError, model != "torchscript",
        "plugins.grad_checkpoint: a TorchScript model's forward is compiled as one piece, with no "
        "blocks to checkpoint one by one (torch.utils.checkpoint does not script either); drop the plugin and "
        "save memory with smaller micro-batches (training.micro_batch_size, the oom_backoff plugin)");
    TRAINER_CHECK_T(trainer::UsageError, !blocks.empty(), "plugins.grad_checkpoint: model '", model,
                    "' exposes no blocks to checkpoint (Model::blocks() is empty); use a model with blocks (vit) or "
                    "drop the plugin");
    std::int64_t wrapped = 0;
    for (std::size_t i = 0; i < blocks.size(); i += static_cast<std::size_t>(s_.every)) {
      blocks[i]->set_wrapper([](trainer::Block& b, const at::Tensor& x) { return trainer::checkpoint_block(b, x); });
      ++wrapped;
    }
    logger_->info("grad_checkpoint: {} of {} blocks checkpointed (every {})", wrapped, blocks.size(), s_.every);
  }

 private:
  GradCheckpointSettings s_;
};

}  // namespace

TRAINER_PLUGIN(GradCheckpointPlugin)
