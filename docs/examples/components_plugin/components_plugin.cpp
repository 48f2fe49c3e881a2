// A dataset, a model and a task (its loss) of one's own, registered by a plugin when it is
// loaded (docs/writing-plugins.md, "Your own model, dataset and loss"). Each declares its keys
// beside it: trainer validates them, suggests a key for a typo, and --print-config and
// `trainer plugins` list them.
#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <cmath>

#include <trainer/data.h>
#include <trainer/model.h>
#include <trainer/plugin.h>
#include <trainer/settings.h>
#include <trainer/task.h>

namespace {

// [dataset] "spirals": two interleaved spirals of 2-D points, one class each.
struct SpiralSettings : trainer::Settings<SpiralSettings> {
  std::int64_t size = 2000;
  double noise = 0.1;
  static void declare(trainer::SettingsSchema<SpiralSettings>& s) {
    s.add(&SpiralSettings::size, "size", "Points per split").min(2);
    s.add(&SpiralSettings::noise, "noise", "Standard deviation of the noise added to each point").min(0);
  }
};

struct Spirals final : trainer::Dataset {
  Spirals(const SpiralSettings& s, std::uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    const at::Tensor t = at::rand({s.size}, gen) * 3 * M_PI;
    y_ = at::randint(2, {s.size}, gen, at::kLong);
    const at::Tensor r = t / (3 * M_PI) + 0.1, a = t + y_.to(at::kFloat) * M_PI;  // class 1: turned by pi
    x_ = at::stack({r * a.cos(), r * a.sin()}, 1) + s.noise * at::randn({s.size, 2}, gen);
  }
  std::int64_t size() const override { return y_.size(0); }
  trainer::Batch get(const at::Tensor& i) const override { return {x_.index_select(0, i), y_.index_select(0, i)}; }
  trainer::DataSpec spec() const override { return {{2}, 2}; }
  at::Tensor x_, y_;
};

// [model] "resmlp": residual blocks, exposed by blocks() (so grad_checkpoint can wrap them).
struct ResMlpSettings : trainer::Settings<ResMlpSettings> {
  std::int64_t width = 64, depth = 4;
  static void declare(trainer::SettingsSchema<ResMlpSettings>& s) {
    s.add(&ResMlpSettings::width, "width", "Width of the blocks").min(1);
    s.add(&ResMlpSettings::depth, "depth", "Residual blocks").min(1);
  }
};

struct ResBlock final : trainer::Block {
  explicit ResBlock(std::int64_t w) : fc(register_module("fc", torch::nn::Linear(w, w))) {}
  at::Tensor forward(const at::Tensor& x) override { return x + at::relu(fc->forward(x)); }
  torch::nn::Linear fc;
};

class ResMlp final : public trainer::Model {
 public:
  ResMlp(const ResMlpSettings& s, const trainer::DataSpec& data)  // data.num_classes: the task's outputs
      : in_(register_module("in", torch::nn::Linear(data.sample_shape.at(0), s.width))),
        head_(register_module("head", torch::nn::Linear(s.width, data.num_classes))) {
    for (std::int64_t i = 0; i < s.depth; ++i) {
      blocks_.push_back(register_module("block" + std::to_string(i), std::make_shared<ResBlock>(s.width)));
    }
  }
  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor h = in_->forward(x);
    for (auto& b : blocks_) h = b->run(h);  // through run(): a plugin may wrap the call
    return head_->forward(h);
  }
  std::vector<std::shared_ptr<trainer::Block>> blocks() override { return blocks_; }

 private:
  torch::nn::Linear in_, head_;
  std::vector<std::shared_ptr<trainer::Block>> blocks_;
};

// [task] "focal": classification (its checks and metrics) with the focal loss per sample.
struct FocalSettings : trainer::Settings<FocalSettings> {
  double gamma = 2.0;
  static void declare(trainer::SettingsSchema<FocalSettings>& s) {
    s.add(&FocalSettings::gamma, "gamma", "Focusing exponent; 0 is cross-entropy").min(0);
  }
};

class ComponentsPlugin final : public trainer::Plugin {
 public:
  ComponentsPlugin() {
    trainer::dataset_registry().add(
        "spirals",
        [](const trainer::Config& c, trainer::Split split) -> std::shared_ptr<trainer::Dataset> {
          return std::make_shared<Spirals>(SpiralSettings::from(c), split == trainer::Split::Train ? 1 : 2);
        },
        SpiralSettings::keys(), "Two interleaved 2-D spirals");
    trainer::model_registry().add(
        "resmlp",
        [](const trainer::Config& c, const trainer::DataSpec& d) -> std::shared_ptr<trainer::Model> {
          return std::make_shared<ResMlp>(ResMlpSettings::from(c), d);
        },
        ResMlpSettings::keys(), "Residual MLP, blocks exposed");
    auto focal_keys = trainer::classification_task_keys();
    for (const auto& k : FocalSettings::keys()) focal_keys.push_back(k);
    trainer::task_registry().add(
        "focal",
        [](const trainer::Config& c, const trainer::DataSpec& d, const trainer::Batch& probe) {
          const double gamma = FocalSettings::from(c).gamma;
          return trainer::classification_task(c, d, probe, [gamma](const at::Tensor& out, const at::Tensor& y) {
            const at::Tensor logp = at::log_softmax(out.to(at::kFloat), 1).gather(1, y.unsqueeze(1)).squeeze(1);
            return -at::pow(1 - logp.exp(), gamma) * logp;  // -(1 - p)^gamma log p
          });
        },
        focal_keys, "Classification with the focal loss");
  }
  std::string name() const override { return "components"; }
  std::vector<trainer::Event> events() const override { return {}; }  // registering is all it does
  void on_event(trainer::EventContext&, trainer::Control&) override {}
};

}  // namespace

TRAINER_PLUGIN(ComponentsPlugin)
