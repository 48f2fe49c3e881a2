// linear_probe: a frozen backbone under a trainable head. In ModelCreated every parameter but
// the head's is frozen and the backbone is kept in eval mode (BatchNorm statistics and
// dropout untouched), so the backbone ends the run bit-identical. With cache_features the
// backbone runs once over both splits (at FitStart, with the weights the run starts from:
// model.weights, or the checkpoint resumed when it holds the whole model) and the run trains
// the head alone on those features: the model becomes the head (the backbone rides along,
// unused) and the datasets become the cached features. Checkpoints over model.weights hold the
// head (what trains) and a digest of the frozen backbone; with export_model the end also
// writes the whole model (backbone and trained head) to <run_dir>/probe_model.pt, loadable as
// model.weights.
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "trainer/data.h"
#include "trainer/distributed.h"
#include "trainer/error.h"
#include "trainer/interrupt.h"
#include "trainer/layers.h"
#include "trainer/loader.h"
#include "trainer/lora.h"
#include "trainer/plugin.h"
#include "trainer/settings.h"

namespace {

struct ProbeSettings : trainer::Settings<ProbeSettings> {
  bool cache_features = false;
  std::int64_t batch_size = 256;
  bool export_model = false;

  static void declare(trainer::SettingsSchema<ProbeSettings>& s) {
    s.add(&ProbeSettings::cache_features, "cache_features",
          "Run the frozen backbone once over the data and train the head on the cached features (every epoch "
          "sees the same, unaugmented samples)");
    s.add(&ProbeSettings::batch_size, "batch_size", "Samples per backbone forward while caching features").min(1);
    s.add(&ProbeSettings::export_model, "export_model",
          "At the end, also write <run_dir>/probe_model.pt: the whole model (frozen backbone and trained head), "
          "loadable as model.weights of a plain run (checkpoints hold the head alone)");
  }
};

/// A dataset's samples as evaluated (`get`, no augmentation) in every epoch: what the loader
/// reads for the features.
class AsEvaluated final : public trainer::Dataset {
 public:
  explicit AsEvaluated(std::shared_ptr<trainer::Dataset> source) : source_(std::move(source)) {}
  std::int64_t size() const override { return source_->size(); }
  trainer::Batch get(const at::Tensor& indices) const override { return source_->get(indices); }
  trainer::Batch get_in_epoch(const at::Tensor& indices, std::int64_t) const override { return source_->get(indices); }
  trainer::DataSpec spec() const override { return source_->spec(); }

 private:
  std::shared_ptr<trainer::Dataset> source_;
};

/// Features of a dataset's samples, filled once by the backbone; the targets are the dataset's.
class FeatureDataset final : public trainer::Dataset {
 public:
  FeatureDataset(std::shared_ptr<trainer::Dataset> source, std::int64_t width)
      : source_(std::move(source)), width_(width) {}
  std::int64_t size() const override { return source_->size(); }
  trainer::Batch get(const at::Tensor& indices) const override {
    TRAINER_CHECK(features_.defined(), "linear_probe: features read before they were computed (FitStart)");
    return {features_.index_select(0, indices), targets_.index_select(0, indices)};
  }
  trainer::DataSpec spec() const override {
    // Features of width_, with the source's classes (or why it declares none).
    const trainer::DataSpec source = source_->spec();
    trainer::DataSpec s{{width_}, source.num_classes};
    s.classes_refused = source.classes_refused;
    return s;
  }

  /// Runs `backbone.features()` over every sample, `batch` at a time, on `device` in `dtype`;
  /// the samples (as `get` gives them) are read ahead by the run's loader workers.
  void fill(trainer::Model& backbone, c10::Device device, c10::ScalarType dtype, std::int64_t batch,
            std::int64_t workers, std::int64_t prefetch) {
    const std::int64_t n = size();
    features_ = at::empty({n, width_}, at::kFloat);
    std::vector<at::Tensor> plan;
    for (std::int64_t start = 0; start < n; start += batch)
      plan.push_back(at::arange(start, std::min(n, start + batch), at::kLong));
    trainer::BatchLoader loader(std::make_shared<AsEvaluated>(source_), workers, prefetch);
    loader.plan(0, plan);
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < plan.size(); ++i) {
      // Caching a large data set through a big backbone takes minutes: Ctrl-C ends the run
      // here, before any step, so no checkpoint holds an untrained head.
      trainer::throw_if_interrupted("caching the probe's features");
      const at::Tensor& idx = plan[i];
      const std::int64_t start = static_cast<std::int64_t>(i) * batch;
      const trainer::Batch b = loader.next(idx);
      // Token ids stay integers; floating inputs take the model's dtype (as the core's step).
      const at::Tensor f =
          backbone.features(b.inputs.is_floating_point() ? b.inputs.to(device, dtype) : b.inputs.to(device));
      TRAINER_CHECK(f.dim() == 2 && f.size(1) == width_, "linear_probe: the backbone's features have shape ", f.sizes(),
                    ", expected [", idx.size(0), ", ", width_, "]");
      features_.narrow(0, start, idx.size(0)).copy_(f);
      if (i == 0) {
        // The targets as the dataset gives them (class indices, labels or values, any task's).
        std::vector<std::int64_t> shape{n};
        shape.insert(shape.end(), b.targets.sizes().begin() + 1, b.targets.sizes().end());
        targets_ = at::empty(shape, b.targets.options());
      }
      targets_.narrow(0, start, idx.size(0)).copy_(b.targets);
    }
  }

 private:
  std::shared_ptr<trainer::Dataset> source_;
  std::int64_t width_;
  at::Tensor features_, targets_;
};

/// The model a cached probe trains: the head on features. The full model is its child
/// "model" (its head is this head), so its parameters keep their names; only the head trains.
class HeadOnly final : public trainer::Model {
 public:
  HeadOnly(std::shared_ptr<trainer::Model> full, std::shared_ptr<trainer::Linear> head)
      : full_(register_module("model", std::move(full))), head_(std::move(head)) {
    keep_in_eval(full_);  // its backbone never runs here; the head is called directly
  }
  at::Tensor forward(const at::Tensor& features) override { return head_->forward(features); }
  const std::shared_ptr<trainer::Model>& full() const { return full_; }

 private:
  std::shared_ptr<trainer::Model> full_;
  std::shared_ptr<trainer::Linear> head_;
};

/// Keeps every module of `m` outside the path to `head` in eval mode (the head trains;
/// modules on its path hold nothing of the backbone but their other children).
void keep_backbone_in_eval(trainer::Model& model, torch::nn::Module& m, const std::string& prefix,
                           const std::string& head) {
  for (const auto& child : m.named_children()) {
    const std::string name = prefix.empty() ? child.key() : prefix + "." + child.key();
    if (name == head) continue;
    if (head.rfind(name + ".", 0) == 0) {
      keep_backbone_in_eval(model, *child.value(), name, head);
    } else {
      model.keep_in_eval(child.value());
    }
  }
}

class LinearProbePlugin final : public trainer::Plugin {
 public:
  std::string name() const override { return "linear_probe"; }
  std::string description() const override {
    return "Linear probe: frozen backbone in eval mode, only the head trains; optionally on cached features";
  }
  std::vector<trainer::Event> events() const override {
    return {trainer::Event::ModelCreated, trainer::Event::FitStart, trainer::Event::FitEnd};
  }
  std::vector<trainer::KeySpec> config_keys() const override { return ProbeSettings::keys(); }
  trainer::FailurePolicy default_policy() const override { return trainer::FailurePolicy::Essential; }

  void configure(const trainer::Config& section, std::shared_ptr<spdlog::logger> logger) override {
    Plugin::configure(section, std::move(logger));
    s_ = ProbeSettings::from(section);
  }

  void on_event(trainer::EventContext& ctx, trainer::Control&) override {
    switch (ctx.event) {
      case trainer::Event::ModelCreated:
        freeze(ctx);
        break;
      case trainer::Event::FitStart:
        if (s_.cache_features) cache(ctx);
        break;
      case trainer::Event::FitEnd: {
        // The ranks hold the same model: rank 0 writes.
        if (!s_.export_model || trainer::rank_of_this_process() != 0) break;
        const std::string file = ctx.run_dir + "/probe_model.pt";
        if (ctx.state.global_step == 0) {
          // Stopped before its first step (Ctrl-C): the head is untrained, nothing to keep.
          logger_->info("linear_probe: no step was trained, {} not written", file);
          break;
        }
        const auto n = trainer::save_merged_model(*full_, file);
        logger_->info("linear_probe: the model ({} tensors, backbone and trained head) written to {}", n, file);
        break;
      }
      default:
        break;
    }
  }

 private:
  void freeze(trainer::EventContext& ctx) {
    full_ = ctx.model;
    const std::string model_name = ctx.config->get<std::string>("model.name");
    head_name_ = full_->head_name();
    TRAINER_CHECK_T(trainer::UsageError, !head_name_.empty(), "plugins.linear_probe: model '", model_name,
                    "' has no classification head to probe with (vit and resnet have)");
    std::shared_ptr<trainer::Linear> head;
    for (const auto& m : full_->named_modules()) {
      if (m.key() == head_name_) head = std::dynamic_pointer_cast<trainer::Linear>(m.value());
    }
    TRAINER_CHECK(head != nullptr, "linear_probe: model '", model_name, "' names its head '", head_name_,
                  "' but has no Linear layer of that name");
    std::int64_t trainable = 0, frozen = 0;
    for (auto& p : full_->named_parameters()) {
      const bool train = p.key().rfind(head_name_ + ".", 0) == 0;
      p.value().set_requires_grad(train);
      (train ? trainable : frozen) += p.value().numel();
    }
    keep_backbone_in_eval(*full_, *full_, "", head_name_);
    logger_->info("linear_probe: backbone frozen in eval mode ({} parameters), head {} trains ({} parameters){}",
                  frozen, head_name_, trainable, s_.cache_features ? "; features cached at the start" : "");
    if (!s_.cache_features) return;
    const std::int64_t width = head->in_features();
    train_ = std::make_shared<FeatureDataset>(ctx.train_set, width);
    ctx.train_set = train_;
    if (ctx.test_set) {
      test_ = std::make_shared<FeatureDataset>(ctx.test_set, width);
      ctx.test_set = test_;
    }
    ctx.model = std::make_shared<HeadOnly>(full_, head);
    dtype_ = trainer::model_dtype(ctx.config->get<std::string>("model.dtype"));
  }

  void cache(trainer::EventContext& ctx) {
    const auto start = std::chrono::steady_clock::now();
    std::int64_t n = 0;
    for (const auto& ds : {train_, test_}) {
      if (!ds) continue;
      ds->fill(*full_, ctx.device, dtype_, s_.batch_size, ctx.config->get<std::int64_t>("loader.workers"),
               ctx.config->get<std::int64_t>("loader.prefetch"));
      n += ds->size();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    logger_->info("linear_probe: features of {} samples cached in {:.1f} s ({} floats each, {:.1f} MiB)", n, s,
                  train_->spec().sample_shape[0],
                  static_cast<double>(n * train_->spec().sample_shape[0] * 4) / (1024.0 * 1024.0));
  }

  ProbeSettings s_;
  std::shared_ptr<trainer::Model> full_;
  std::string head_name_;
  std::shared_ptr<FeatureDataset> train_, test_;
  c10::ScalarType dtype_ = c10::kFloat;
};

}  // namespace

TRAINER_PLUGIN(LinearProbePlugin)
