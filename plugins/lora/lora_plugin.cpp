// lora: low-rank adapters on a frozen model (trainer/lora.h). In ModelCreated it attaches an
// adapter to every layer matching `targets`, freezes everything but the adapters, the head and
// `trainable`, and loads `adapters` when given; the optimizer, built after, holds only what
// trains. At every checkpoint and at the end it writes the adapters alone to
// <run_dir>/lora_adapters.pt, with the digest of the frozen weights they apply to; with export_merged, the end also
// writes the merged model (a BERT also as a Hugging Face model directory).
#include <spdlog/spdlog.h>

#include <filesystem>

#include "trainer/distributed.h"
#include "trainer/error.h"
#include "trainer/lora.h"
#include "trainer/plugin.h"
#include "trainer/settings.h"

namespace {

struct LoraSettings : trainer::Settings<LoraSettings> {
  std::int64_t rank = 8;
  double alpha = 16.0;
  double dropout = 0.0;
  std::vector<std::string> targets{"*.q_proj", "*.v_proj"};
  bool train_head = true;
  std::vector<std::string> trainable;
  std::string adapters;
  bool export_merged = false;

  static void declare(trainer::SettingsSchema<LoraSettings>& s) {
    s.add(&LoraSettings::rank, "rank", "Rank r of each adapter (A is r x in, B is out x r)").min(1);
    s.add(&LoraSettings::alpha, "alpha", "The adapter's term is scaled by alpha / rank").min(0, false);
    s.add(&LoraSettings::dropout, "dropout", "Dropout on the adapters' input while training").min(0).max(1, false);
    s.add(&LoraSettings::targets, "targets",
          "Name patterns (* wildcards) of the Linear/Conv2d layers to adapt, as in the model's module names: "
          "\"*.q_proj\", \"*.out_proj\", \"*.mlp.0\" (ViT), \"layer4.*.conv2\" (ResNet), \"*.query\", \"*.value\" "
          "(BERT, as PEFT names them)");
    s.add(&LoraSettings::train_head, "train_head",
          "Train the model's classification head (heads.head for the ViT, fc for the ResNet) with the adapters");
    s.add(&LoraSettings::trainable, "trainable",
          "Name patterns of further parameters that train (all others besides adapters and head are frozen)");
    s.add(&LoraSettings::adapters, "adapters",
          "A lora_adapters.pt of an earlier run to start from (same targets, rank and alpha); empty = fresh adapters");
    s.add(&LoraSettings::export_merged, "export_merged",
          "At the end, also write <run_dir>/merged_model.pt: the model with the adapters merged into its weights, "
          "loadable as model.weights of a plain model; a model \"bert\" also as <run_dir>/hf_model, the directory "
          "transformers' from_pretrained loads");
  }
};

class LoraPlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "lora"; }
  std::string description() const override {
    return "LoRA: low-rank adapters on the model's layers, everything else frozen; adapter files and merged export";
  }
  std::vector<trainer::Event> events() const override {
    return {trainer::Event::ModelCreated, trainer::Event::Checkpoint, trainer::Event::FitEnd};
  }
  std::vector<trainer::KeySpec> config_keys() const override { return LoraSettings::keys(); }
  // A run that was to train adapters must not silently train the whole model or nothing.
  trainer::FailurePolicy default_policy() const override { return trainer::FailurePolicy::Essential; }

  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    s_ = LoraSettings::from(section);
  }

  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    switch (ctx.event) {
      case trainer::Event::ModelCreated:
        adapt(ctx);
        break;
      case trainer::Event::Checkpoint:
        save(ctx);
        break;
      case trainer::Event::FitEnd:
        if (trainer::rank_of_this_process() != 0) break;  // the ranks hold the same model: rank 0 writes
        save(ctx);
        if (s_.export_merged) {
          const std::string file = ctx.run_dir + "/merged_model.pt";
          const auto n = trainer::save_merged_model(*ctx.model, file);
          logger_->info("lora: merged model ({} tensors) written to {}", n, file);
          // A BERT also as transformers loads it (PEFT's merge_and_unload, then save_pretrained).
          const std::string hf = ctx.run_dir + "/hf_model";
          if (trainer::save_merged_hf_directory(*ctx.model, hf)) {
            logger_->info("lora: merged model written to {} (config.json, model.safetensors)", hf);
          }
        }
        break;
      default:
        break;
    }
  }

 private:
  void adapt(trainer::EventContext& ctx) {
    trainer::LoraOptions o;
    o.rank = s_.rank;
    o.alpha = s_.alpha;
    o.dropout = s_.dropout;
    o.targets = s_.targets;
    o.trainable = s_.trainable;
    if (s_.train_head) {
      const std::string head = ctx.model->head_name();
      TRAINER_CHECK_T(trainer::UsageError, !head.empty(), "plugins.lora.train_head: model '",
                      ctx.config->get<std::string>("model.name"),
                      "' names no classification head; set train_head = false and list what trains in "
                      "plugins.lora.trainable");
      o.trainable.push_back(head + ".*");
    }
    trainer::LoraReport r;
    try {
      r = trainer::apply_lora(*ctx.model, o);
    } catch (const trainer::UsageError& e) {
      throw trainer::UsageError(std::string("plugins.lora: ") + e.what());
    }
    const std::int64_t total = r.trainable_parameters + r.frozen_parameters;
    logger_->info(
        "lora: {} layers adapted (rank {}, alpha {}): {} adapter parameters; {} of {} parameters train "
        "({:.2f} %), {} frozen",
        r.adapted.size(), s_.rank, s_.alpha, r.adapter_parameters, r.trainable_parameters, total,
        total > 0 ? 100.0 * static_cast<double>(r.trainable_parameters) / static_cast<double>(total) : 0.0,
        r.frozen_parameters);
    if (!s_.adapters.empty()) {
      const auto n = trainer::load_adapters(*ctx.model, s_.adapters);
      logger_->info("lora: {} tensors loaded from {}", n, s_.adapters);
    }
    // The frozen weights the adapters apply to, recorded in every adapter file: read once here
    // (on the host, before the model moves to its device), not at every save.
    base_ = trainer::frozen_base_digest(*ctx.model);
  }

  void save(trainer::EventContext& ctx) {
    const std::string file = ctx.run_dir + "/lora_adapters.pt";
    const auto n = trainer::save_adapters(*ctx.model, file, base_);
    logger_->debug("lora: {} tensors written to {}", n, file);
  }

  LoraSettings s_;
  std::string base_;  ///< frozen_base_digest after adapt()
};

}  // namespace

TRAINER_PLUGIN(LoraPlugin)
