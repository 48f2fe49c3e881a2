// LoRA adapters: attach, freeze, merge, and their files.
#include "trainer/lora.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fnmatch.h>
#include <torch/nn/init.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "model/bert.h"
#include "model/script_archive.h"
#include "model/tensor_archive.h"
#include "model/torchscript.h"
#include "trainer/error.h"
#include "trainer/layers.h"

namespace trainer {

namespace {

bool matches(const std::string& name, const std::string& pattern) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

/// The LoRA term of one layer: (alpha / rank) * B A dropout(x), A and B as linear maps or,
/// for a convolution, A a conv of the layer's geometry to `rank` channels and B a 1x1 conv.
class LoraAdapter final : public Adapter {
 public:
  LoraAdapter(const Linear& layer, const LoraOptions& o) : LoraAdapter(o) {
    const auto opts = layer.weight().options();
    a_ = register_parameter("A", at::empty({o.rank, layer.in_features()}, opts));
    b_ = register_parameter("B", at::zeros({layer.out_features(), o.rank}, opts));
    init();
  }
  LoraAdapter(const Conv2d& layer, const LoraOptions& o) : LoraAdapter(o) {
    const auto opts = layer.weight().options();
    a_ = register_parameter("A", at::empty({o.rank, layer.in_channels(), layer.kernel(), layer.kernel()}, opts));
    b_ = register_parameter("B", at::zeros({layer.out_channels(), o.rank, 1, 1}, opts));
    conv_ = true;
    stride_ = layer.stride();
    padding_ = layer.padding();
    init();
  }

  at::Tensor forward(const at::Tensor& x) override {
    const at::Tensor in = dropout_ > 0 ? at::dropout(x, dropout_, is_training()) : x;
    const at::Tensor h = conv_ ? at::conv2d(at::conv2d(in, a_, {}, {stride_, stride_}, {padding_, padding_}), b_)
                               : at::linear(at::linear(in, a_), b_);
    return h * scale();
  }

  at::Tensor delta_weight() const override {
    const at::Tensor d = at::matmul(b_.flatten(1), a_.flatten(1)) * scale();
    return conv_ ? d.view({b_.size(0), a_.size(1), a_.size(2), a_.size(3)}) : d;
  }

  std::int64_t rank() const { return rank_; }
  double alpha() const { return alpha_; }

 private:
  explicit LoraAdapter(const LoraOptions& o) : rank_(o.rank), alpha_(o.alpha), dropout_(o.dropout) {}
  /// A as peft initialises it (nn.Linear's own init), drawn from the CPU generator wherever the
  /// layer is, so that a run's adapters start the same on every device for one seed.
  void init() {
    at::NoGradGuard no_grad;
    at::Tensor a = a_.device().is_cpu() ? a_ : at::empty(a_.sizes(), a_.options().device(at::kCPU));
    torch::nn::init::kaiming_uniform_(a, std::sqrt(5.0));
    if (!a_.device().is_cpu()) a_.copy_(a);
  }
  double scale() const { return alpha_ / static_cast<double>(rank_); }

  std::int64_t rank_;
  double alpha_, dropout_;
  at::Tensor a_, b_;
  bool conv_ = false;
  std::int64_t stride_ = 1, padding_ = 0;
};

struct Layer {
  std::string name;
  std::shared_ptr<AdaptableLayer> layer;
};

std::vector<Layer> adaptable_layers(Model& model) {
  std::vector<Layer> out;
  for (const auto& m : model.named_modules("", /*include_self=*/false)) {
    if (auto l = std::dynamic_pointer_cast<AdaptableLayer>(m.value())) out.push_back({m.key(), std::move(l)});
  }
  return out;
}

std::vector<Layer> adapted_layers(Model& model) {
  std::vector<Layer> out;
  for (auto& l : adaptable_layers(model)) {
    if (l.layer->adapter()) out.push_back(std::move(l));
  }
  return out;
}

/// The TensorImpls of every adapter parameter, to tell them from the model's own.
std::set<const void*> adapter_tensors(Model& model) {
  std::set<const void*> out;
  for (const auto& l : adapted_layers(model)) {
    for (const auto& p : l.layer->adapter()->parameters()) out.insert(p.unsafeGetTensorImpl());
  }
  return out;
}

const LoraAdapter& lora_of(const Layer& l) {
  const auto* a = dynamic_cast<const LoraAdapter*>(l.layer->adapter().get());
  TRAINER_CHECK(a != nullptr, "layer '", l.name, "' has an adapter that is not LoRA's");
  return *a;
}

std::string list_of(const std::vector<Layer>& layers) {
  std::ostringstream os;
  const std::size_t shown = std::min<std::size_t>(layers.size(), 6);
  for (std::size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << layers[i].name;
  if (layers.size() > shown) os << ", ... (" << layers.size() << " in all)";
  return os.str();
}

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

}  // namespace

LoraReport apply_lora(Model& model, const LoraOptions& o) {
  TRAINER_CHECK_T(UsageError, o.rank >= 1, "LoRA rank = ", o.rank, ": must be at least 1");
  TRAINER_CHECK_T(UsageError, o.alpha > 0, "LoRA alpha = ", o.alpha, ": must be positive");
  TRAINER_CHECK_T(UsageError, o.dropout >= 0 && o.dropout < 1, "LoRA dropout = ", o.dropout, ": must be in [0, 1)");
  TRAINER_CHECK_T(UsageError, !o.targets.empty(),
                  "LoRA targets: empty; name the layers to adapt by pattern, "
                  "e.g. [\"*.self_attention.q_proj\", \"*.self_attention.v_proj\"]");
  const std::vector<Layer> layers = adaptable_layers(model);
  TRAINER_CHECK_T(UsageError, !is_torchscript_model(model),
                  "LoRA: a TorchScript model's layers are compiled into its forward, where no adapter can be added; "
                  "add the adapters in Python before torch.jit.script (the adapter weights then train as parameters, "
                  "and model.freeze can freeze the rest)");
  TRAINER_CHECK_T(UsageError, !layers.empty(),
                  "LoRA: the model has no adaptable layer (trainer::Linear or trainer::Conv2d); vit and resnet have");
  std::vector<const Layer*> chosen;
  for (const auto& pattern : o.targets) {
    bool any = false;
    for (const auto& l : layers) {
      if (!matches(l.name, pattern)) continue;
      any = true;
      if (std::find(chosen.begin(), chosen.end(), &l) == chosen.end()) chosen.push_back(&l);
    }
    TRAINER_CHECK_T(UsageError, any, "LoRA target '", pattern, "' matches no Linear or Conv2d layer of the model; ",
                    "its layers are ", list_of(layers));
  }
  std::sort(chosen.begin(), chosen.end());  // the model's order: `layers` is in it

  for (const Layer* l : chosen) {  // all checked before any is changed
    TRAINER_CHECK_T(UsageError, !l->layer->adapter(), "LoRA: layer '", l->name, "' has an adapter already");
  }
  LoraReport report;
  for (const Layer* l : chosen) {
    std::shared_ptr<Adapter> adapter;
    if (const auto* lin = dynamic_cast<const Linear*>(l->layer.get())) {
      adapter = std::make_shared<LoraAdapter>(*lin, o);
    } else if (const auto* conv = dynamic_cast<const Conv2d*>(l->layer.get())) {
      adapter = std::make_shared<LoraAdapter>(*conv, o);
    } else {
      throw UsageError(fmt::format("LoRA: layer '{}' is neither a Linear nor a Conv2d", l->name));
    }
    adapter->train(model.is_training());
    l->layer->set_adapter("lora", adapter);
    report.adapted.push_back(l->name);
  }

  const std::set<const void*> adapters = adapter_tensors(model);
  std::vector<bool> used(o.trainable.size(), false);
  for (auto& p : model.named_parameters()) {
    bool train = adapters.count(p.value().unsafeGetTensorImpl()) > 0;
    if (train) report.adapter_parameters += p.value().numel();
    for (std::size_t i = 0; i < o.trainable.size(); ++i) {
      if (matches(p.key(), o.trainable[i])) {
        used[i] = true;
        train = true;
      }
    }
    p.value().set_requires_grad(train);
    (train ? report.trainable_parameters : report.frozen_parameters) += p.value().numel();
  }
  for (std::size_t i = 0; i < o.trainable.size(); ++i) {
    TRAINER_CHECK_T(UsageError, used[i], "LoRA trainable '", o.trainable[i],
                    "' matches no parameter of the model (the head is \"",
                    model.head_name().empty() ? "?" : model.head_name(), ".*\")");
  }
  return report;
}

namespace {

/// What an adapters file holds: the adapters, the other parameters that train (the head), and
/// every buffer of the model (BatchNorm's running statistics move while the adapters train,
/// so the frozen weights alone would not give back the trained model; the ViT has none).
detail::NamedTensors adapter_file_tensors(Model& model) {
  detail::NamedTensors out;
  const std::set<const void*> adapters = adapter_tensors(model);
  for (const auto& p : model.named_parameters()) {
    if (adapters.count(p.value().unsafeGetTensorImpl()) || p.value().requires_grad()) out[p.key()] = p.value();
  }
  for (const auto& b : model.named_buffers()) out[b.key()] = b.value();
  return out;
}

}  // namespace

std::int64_t merge_adapters(Model& model) {
  std::int64_t n = 0;
  for (const auto& l : adapted_layers(model)) {
    if (!l.layer->merged()) {
      l.layer->merge();
      ++n;
    }
  }
  return n;
}

std::int64_t unmerge_adapters(Model& model) {
  std::int64_t n = 0;
  for (const auto& l : adapted_layers(model)) {
    if (l.layer->merged()) {
      l.layer->unmerge();
      ++n;
    }
  }
  return n;
}

std::int64_t save_adapters(Model& model, const std::string& file, const std::string& frozen_base) {
  const auto layers = adapted_layers(model);
  TRAINER_CHECK_T(UsageError, !layers.empty(), "cannot save adapters to ", file, ": the model has none");
  const LoraAdapter& first = lora_of(layers.front());
  for (const auto& l : layers) {
    TRAINER_CHECK(lora_of(l).rank() == first.rank() && lora_of(l).alpha() == first.alpha(),
                  "LoRA adapters of different rank or alpha in one model ('", l.name, "')");
  }
  const detail::NamedTensors tensors = adapter_file_tensors(model);
  torch::serialize::OutputArchive ar;
  torch::serialize::OutputArchive inner(ar.compilation_unit());
  detail::write_nested(inner, tensors);
  ar.write("tensors", inner);
  ar.write("lora_rank", at::scalar_tensor(first.rank(), at::kLong));
  ar.write("lora_alpha", at::scalar_tensor(first.alpha(), at::kDouble));
  ar.write("frozen_base", c10::IValue(frozen_base.empty() ? frozen_base_digest(model) : frozen_base));
  detail::save_archive(ar, file);
  return static_cast<std::int64_t>(tensors.size());
}

std::int64_t load_adapters(Model& model, const std::string& file) {
  TRAINER_CHECK_T(UsageError, std::filesystem::is_regular_file(file), "LoRA adapters \"", file, "\": no such file");
  const auto layers = adapted_layers(model);
  TRAINER_CHECK_T(UsageError, !layers.empty(), "LoRA adapters \"", file,
                  "\": the model has no adapter to load them into (apply LoRA first)");
  for (const auto& l : layers) {  // its weight holds the current adapter's product: new factors would not undo it
    TRAINER_CHECK_T(UsageError, !l.layer->merged(), "LoRA adapters \"", file, "\": layer '", l.name,
                    "' has its adapter merged into its weight; unmerge the adapters before loading others");
  }
  torch::serialize::InputArchive ar, inner;
  at::Tensor rank, alpha;
  try {
    ar = detail::read_script_archive(file, at::kCPU);
  } catch (const detail::ArchiveCodeError& e) {
    throw UsageError(fmt::format(
        "LoRA adapters \"{}\": not a file of adapters that trainer wrote: {}. trainer reads adapters as data and runs "
        "no code from them; give the lora_adapters.pt that a run with plugins.lora wrote",
        file, e.what()));
  } catch (const detail::TorchSaveError& e) {
    throw UsageError(fmt::format("LoRA adapters \"{}\": its archive is refused: {}", file, e.what()));
  }
  TRAINER_CHECK_T(UsageError,
                  ar.try_read("tensors", inner) && ar.try_read("lora_rank", rank) && ar.try_read("lora_alpha", alpha),
                  "LoRA adapters \"", file, "\": not a file of adapters (no tensors, lora_rank or lora_alpha entry)");
  const LoraAdapter& first = lora_of(layers.front());
  TRAINER_CHECK_T(UsageError, rank.item<std::int64_t>() == first.rank() && alpha.item<double>() == first.alpha(),
                  "LoRA adapters \"", file, "\" have rank ", rank.item<std::int64_t>(), " and alpha ",
                  alpha.item<double>(), "; the model's have rank ", first.rank(), " and alpha ", first.alpha());
  detail::NamedTensors from;
  detail::read_nested(inner, "", from);

  detail::NamedTensors into = adapter_file_tensors(model);
  for (const auto& [name, t] : from) {
    const auto it = into.find(name);
    TRAINER_CHECK_T(
        UsageError, it != into.end(), "LoRA adapters \"", file, "\": '", name,
        "' is not an adapter, trainable parameter or buffer of this model (other LoRA targets or trainable?)");
    TRAINER_CHECK_T(UsageError, it->second.sizes() == t.sizes(), "LoRA adapters \"", file, "\": '", name,
                    "' has shape ", shape_of(t), ", the model's ", shape_of(it->second));
  }
  std::set<std::string> buffers;
  for (const auto& b : model.named_buffers()) buffers.insert(b.key());
  for (const auto& [name, t] : into) {
    TRAINER_CHECK_T(UsageError, from.count(name), "LoRA adapters \"", file, "\": '", name, "' is missing",
                    buffers.count(name)
                        ? " (a buffer of the model, e.g. BatchNorm's running statistics: the file holds "
                          "none, as files written before adapter files carried the model's buffers)"
                        : " (other LoRA targets or trainable?)");
  }
  // The frozen weights they were trained over (files written before adapter files recorded
  // them are taken as they are).
  c10::IValue base;
  if (ar.try_read("frozen_base", base) && base.isString()) {
    const std::string now = frozen_base_digest(model);
    TRAINER_CHECK_T(UsageError, now == base.toStringRef(), "LoRA adapters \"", file,
                    "\" were trained over frozen weights of digest ", base.toStringRef(),
                    "; this model's frozen weights have digest ", now,
                    " (another model.weights, or other targets, trainable or train_head): adapters apply to the "
                    "weights they were trained with");
  }
  at::NoGradGuard no_grad;
  for (auto& [name, t] : into) t.copy_(from.at(name));
  return static_cast<std::int64_t>(into.size());
}

namespace {

/// The model's parameters and buffers, the adapters left out and merged into the weights they
/// adapt (copies of those; the model is left as it is).
detail::NamedTensors merged_tensors(Model& model) {
  const std::set<const void*> adapters = adapter_tensors(model);
  detail::NamedTensors tensors;
  std::vector<std::pair<std::string, at::Tensor>> own;  // name, the model's tensor
  for (const auto& p : model.named_parameters()) {
    if (!adapters.count(p.value().unsafeGetTensorImpl())) own.emplace_back(p.key(), p.value());
  }
  for (const auto& b : model.named_buffers()) own.emplace_back(b.key(), b.value());
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : own) tensors[name] = t;
  for (const auto& l : adapted_layers(model)) {
    if (l.layer->merged()) continue;  // its weight holds the adapter already
    const at::Tensor w = l.layer->weight();
    // The parameter the layer's weight is (or is rows of: a part of a fused projection).
    auto owner = std::find_if(own.begin(), own.end(), [&](const auto& kv) { return w.is_alias_of(kv.second); });
    TRAINER_CHECK(owner != own.end(), "layer '", l.name, "': its weight is no parameter of the model");
    at::Tensor& out = tensors[owner->first];
    if (out.is_same(owner->second)) out = owner->second.clone(at::MemoryFormat::Preserve);
    at::Tensor rows = out.as_strided(w.sizes(), w.strides(), w.storage_offset() - owner->second.storage_offset());
    rows.add_(l.layer->adapter()->delta_weight());
  }
  return tensors;
}

}  // namespace

std::int64_t save_merged_model(Model& model, const std::string& file) {
  const detail::NamedTensors tensors = merged_tensors(model);
  torch::serialize::OutputArchive ar;
  torch::serialize::OutputArchive inner(ar.compilation_unit());
  detail::write_nested(inner, tensors);
  ar.write("model", inner);
  detail::save_archive(ar, file);
  return static_cast<std::int64_t>(tensors.size());
}

bool save_merged_hf_directory(Model& model, const std::string& dir) {
  if (!is_bert(model)) return false;
  const detail::NamedTensors tensors = merged_tensors(model);
  return save_hf_directory(model, dir, &tensors);
}

}  // namespace trainer
