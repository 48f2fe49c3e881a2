// Model "torchscript": a module written in Python, saved with torch.jit.script(...).save(),
// trained by the core as any other model. Its parameters and buffers are mirrored, the same
// tensors under the same (state_dict) names, into the trainer's Model, so that the optimizer,
// checkpoints, model.weights, the device move and the memory accounting see them unchanged.
#include "model/torchscript.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fnmatch.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/version.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

#include "model/zip_archive.h"
#include "trainer/error.h"
#include "util/durable_file.h"

namespace trainer {

namespace {

namespace fs = std::filesystem;

std::string shape_text(at::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

/// An error of LibTorch or of the TorchScript interpreter: its last line (the error itself, as
/// "RuntimeError: ...") first, then the TorchScript traceback that led to it, without the C++
/// backtrace.
std::string error_summary(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const std::size_t last = text.rfind('\n');
  if (last == std::string::npos) return text;
  return text.substr(last + 1) + "\n" + text.substr(0, last);
}

/// The TorchScript interpreter rethrows an error of an op inside the module as a
/// std::runtime_error holding its text: an out-of-memory error (c10::OutOfMemoryError, or a
/// CUDA library's allocation failure) gets its type back here, so that the core's recovery
/// sees an OOM whether it happened in a scripted forward or an eager one. Returns when `e` is
/// not one.
void retype_out_of_memory(const std::exception& e) {
  const std::string text = e.what();
  if (text.rfind("The following operation failed in the TorchScript interpreter.", 0) != 0) return;
  const std::string last = error_summary(e).substr(0, error_summary(e).find('\n'));
  for (const char* oom : {"out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED"}) {
    if (last.find(oom) != std::string::npos) TORCH_CHECK_WITH(OutOfMemoryError, false, error_summary(e));
  }
}

std::string where(const std::string& file) { return fmt::format("model.path = \"{}\"", file); }

/// A TorchScript file a key names: the key ("model.path"), the file, and what Python scripts
/// into it ("model", "loss"), for the messages.
struct ScriptFile {
  std::string key;
  std::string file;
  std::string what;
  std::string where() const { return fmt::format("{} = \"{}\"", key, file); }
  std::string save_hint() const { return fmt::format("torch.jit.script({}).save(path)", what); }
};

/// The file must be a TorchScript archive: a zip that ZipArchive accepts (LibTorch's reader is
/// not given a file it refuses) with the records torch.jit.save writes. A torch.save file (a
/// state_dict) has data.pkl but no constants.pkl nor code. Then LibTorch loads it (on the CPU).
torch::jit::Module load_module(const ScriptFile& f) {
  std::error_code ec;
  TRAINER_CHECK_T(UsageError, fs::is_regular_file(f.file, ec), f.where(), ": no such file; save the ", f.what,
                  " in Python with ", f.save_hint());
  if (const auto problem = detail::archive_problem(f.file)) {
    throw UsageError(fmt::format("{}: not a TorchScript module file ({}); save the {} with {}", f.where(), *problem,
                                 f.what, f.save_hint()));
  }
  const auto zip = detail::ZipArchive::open(f.file);
  TRAINER_CHECK_T(UsageError, zip && zip->has("data.pkl"), f.where(),
                  ": not a TorchScript module file (no data.pkl record)");
  TRAINER_CHECK_T(UsageError, zip->has("constants.pkl"), f.where(),
                  ": a torch.save file (a pickled object such as a state_dict), not a TorchScript module; save the ",
                  f.what, " with ", f.save_hint(),
                  f.what == "model" ? ", or give a state_dict as model.weights of a built-in model" : "");
  try {
    return torch::jit::load(f.file, c10::Device(c10::kCPU));
  } catch (const std::exception& e) {
    throw UsageError(
        fmt::format("{}: LibTorch {} cannot load it as a TorchScript module (a file saved by a newer "
                    "PyTorch may use operators this one lacks): {}",
                    f.where(), TORCH_VERSION, error_summary(e)));
  }
}

/// forward must take `tensors` tensors (further arguments need defaults) and return one tensor;
/// `wanted` says which, for the message.
void check_forward(const torch::jit::Module& m, const ScriptFile& f, std::size_t tensors, const char* wanted) {
  const auto method = m.find_method("forward");
  TRAINER_CHECK_T(UsageError, method.has_value(), f.where(), ": the ", f.what, " has no forward method");
  const c10::FunctionSchema& s = method->function().getSchema();
  std::size_t required = 0;
  for (std::size_t i = 1; i < s.arguments().size(); ++i) {
    if (!s.arguments()[i].default_value()) ++required;
  }
  bool takes_tensors = s.arguments().size() >= 1 + tensors;
  for (std::size_t i = 1; takes_tensors && i <= tensors; ++i) {
    takes_tensors = s.arguments()[i].type()->kind() == c10::TypeKind::TensorType;
  }
  const bool returns_tensor = s.returns().size() == 1 && s.returns()[0].type()->kind() == c10::TypeKind::TensorType;
  if (takes_tensors && required == tensors && returns_tensor) return;
  std::ostringstream schema;
  schema << s;
  throw UsageError(fmt::format("{}: forward must take {}; it is `{}`", f.where(), wanted, schema.str()));
}

/// A torch::nn::Module tree with the TorchScript module's parameters and buffers (the same
/// tensors) under the same names: nn::Module refuses dotted names, so each submodule gets
/// its own node.
void mirror(const torch::jit::Module& from, torch::nn::Module& to,
            std::vector<std::pair<torch::nn::Module*, torch::jit::Module>>& pairs) {
  pairs.emplace_back(&to, from);
  for (const auto& p : from.named_parameters(/*recurse=*/false)) {
    if (p.value.defined()) to.register_parameter(p.name, p.value, p.value.requires_grad());
  }
  for (const auto& b : from.named_buffers(/*recurse=*/false)) {
    if (b.value.defined()) to.register_buffer(b.name, b.value);
  }
  for (const auto& c : from.named_children()) {
    mirror(c.value, *to.register_module(c.name, std::make_shared<torch::nn::Module>()), pairs);
  }
}

class TorchScriptModel final : public Model {
 public:
  TorchScriptModel(torch::jit::Module module, std::string file) : module_(std::move(module)), file_(std::move(file)) {
    mirror(module_, *this, pairs_);
  }

  at::Tensor forward(const at::Tensor& x) override {
    // Plain autograd through the interpreter: no differentiable subgraphs or fusions, so the
    // first steps are not slow (profiling runs), autocast is the dispatcher's (as in eager
    // PyTorch) and the ops are the ones Python's eager module runs. The setting is per thread.
    torch::jit::GraphOptimizerEnabledGuard plain(false);
    c10::IValue out;
    try {
      out = module_.forward({x});
    } catch (const c10::Error&) {
      throw;
    } catch (const std::exception& e) {
      retype_out_of_memory(e);
      throw;
    }
    TRAINER_CHECK(out.isTensor(), where(file_), ": forward returned a ", out.tagKind(), ", not a Tensor");
    return out.toTensor();
  }

  /// Model::train (which honours keep_in_eval), then each TorchScript submodule takes the mode
  /// of its mirror: forward reads the module's own `training` attributes.
  void train(bool on) override {
    Model::train(on);
    for (auto& [nn, jit] : pairs_) {
      if (jit.hasattr("training")) jit.setattr("training", nn->is_training());
    }
  }

  void save_module(const std::string& path) const {
    try {
      write_atomic(path, [this](std::ostream& out) { module_.save(out); });
    } catch (const c10::Error& e) {
      throw Error(fmt::format("writing the TorchScript module to {}: {}", path, e.what_without_backtrace()));
    }
  }

  torch::jit::Module& module() { return module_; }

 private:
  torch::jit::Module module_;
  std::string file_;
  std::vector<std::pair<torch::nn::Module*, torch::jit::Module>> pairs_;
};

/// A parameter shared by two submodules (tied weights) would reach the optimizer, the gradient
/// clipping and the data-parallel buckets once per name: refused until they are deduplicated.
void check_untied(const torch::jit::Module& m, const std::string& file) {
  std::map<const void*, std::string> first;
  for (const auto& p : m.named_parameters(true)) {
    const auto [it, fresh] = first.emplace(p.value.unsafeGetTensorImpl(), p.name);
    TRAINER_CHECK_T(UsageError, fresh, where(file), ": parameters '", it->second, "' and '", p.name,
                    "' are one tensor (tied weights), which trainer cannot train yet in a TorchScript module; untie "
                    "them in Python (e.g. give the output layer its own copy) before torch.jit.script");
  }
}

void freeze(torch::jit::Module& m, const std::vector<std::string>& patterns, const std::string& file) {
  std::vector<std::string> names;  // the first few, for the message
  for (const auto& p : m.named_parameters(true)) {
    if (names.size() == 8) {
      names.emplace_back("...");
      break;
    }
    names.push_back(p.name);
  }
  for (const auto& pattern : patterns) {
    bool any = false;
    for (const auto& p : m.named_parameters(true)) {
      if (fnmatch(pattern.c_str(), p.name.c_str(), 0) != 0) continue;
      p.value.requires_grad_(false);
      any = true;
    }
    TRAINER_CHECK_T(UsageError, any, "model.freeze: '", pattern, "' matches no parameter of ", file,
                    "; its parameters are ", fmt::format("{}", fmt::join(names, ", ")));
  }
}

/// Floating-point tensors to `dtype`, in place (the same tensors); integer buffers such as
/// BatchNorm's num_batches_tracked keep their type, as Python's Module.to(dtype) does.
void convert(torch::jit::Module& m, c10::ScalarType dtype) {
  for (const auto& p : m.named_parameters(true)) {
    if (p.value.is_floating_point() && p.value.scalar_type() != dtype) p.value.set_data(p.value.to(dtype));
  }
  for (const auto& b : m.named_buffers(true)) {
    if (b.value.is_floating_point() && b.value.scalar_type() != dtype) b.value.set_data(b.value.to(dtype));
  }
}

/// One forward, in eval mode and without gradients, of a zero sample of the data's shape: the
/// module must accept it and return the task's outputs [1, data.num_classes] (per token:
/// [1, L, K], K at least data.num_classes).
void check_dry_run(torch::jit::Module& m, const DataSpec& data, c10::ScalarType dtype, const std::string& file) {
  std::vector<std::int64_t> shape{1};
  shape.insert(shape.end(), data.sample_shape.begin(), data.sample_shape.end());
  const bool was_training = m.is_training();
  m.eval();
  c10::IValue out;
  try {
    at::NoGradGuard no_grad;
    torch::jit::GraphOptimizerEnabledGuard plain(false);
    out = m.forward({at::zeros(shape, at::TensorOptions(dtype))});
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("{}: forward failed on one sample of the dataset's shape {} ({}): {}", where(file),
                                 shape_text(shape), c10::toString(dtype), error_summary(e)));
  }
  m.train(was_training);
  TRAINER_CHECK_T(UsageError, out.isTensor(), where(file), ": forward returned a ", out.tagKind(), ", not a Tensor");
  const at::Tensor y = out.toTensor();
  if (data.token_outputs) {
    TRAINER_CHECK_T(UsageError, y.dim() == 3 && y.size(0) == 1 && y.size(2) >= data.num_classes, where(file),
                    ": forward of one sample of shape ", shape_text(shape), " returned ", shape_text(y.sizes()),
                    "; the task needs outputs per token [1, L, K] with K at least ", data.num_classes,
                    " (masked_lm: logits over the vocabulary)");
    return;
  }
  TRAINER_CHECK_T(UsageError, y.dim() == 2 && y.size(0) == 1 && y.size(1) == data.num_classes, where(file),
                  ": forward of one sample of shape ", shape_text(shape), " returned ", shape_text(y.sizes()),
                  "; the task needs outputs [1, ", data.num_classes,
                  "] (task.name: classification: one per class, "
                  "multilabel: one per label, regression: one per target)");
}

}  // namespace

std::shared_ptr<Model> load_torchscript_model(const Config& section, const DataSpec& data) {
  const TorchScriptSettings s = TorchScriptSettings::from(section);
  TRAINER_CHECK_T(UsageError, !s.path.empty(),
                  "model.path is empty; name the file that "
                  "torch.jit.script(model).save(path) wrote");
  torch::jit::Module m = load_module({"model.path", s.path, "model"});
  check_forward(m, {"model.path", s.path, "model"}, 1,
                "one Tensor (the batch; further arguments need defaults) and return one Tensor (the logits)");
  check_untied(m, s.path);
  const c10::ScalarType dtype = model_dtype(ModelSettings::from(section).dtype);
  convert(m, dtype);
  check_dry_run(m, data, dtype, s.path);
  freeze(m, s.freeze, s.path);
  return std::make_shared<TorchScriptModel>(std::move(m), s.path);
}

namespace {

/// A loss scripted in Python: forward(outputs, targets) -> each sample's loss [N]. Its floating
/// buffers (constants such as class weights) follow the outputs to their device and dtype. One
/// call at a time: a call may move them.
class ScriptedLoss {
 public:
  ScriptedLoss(torch::jit::Module module, ScriptFile file) : module_(std::move(module)), file_(std::move(file)) {}

  at::Tensor operator()(const at::Tensor& outputs, const at::Tensor& targets) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (outputs.device() != device_) {
      module_.to(outputs.device());
      device_ = outputs.device();
    }
    if (outputs.is_floating_point() && dtype_ != outputs.scalar_type()) {
      convert(module_, outputs.scalar_type());
      dtype_ = outputs.scalar_type();
    }
    const auto versions = std::make_pair(outputs._version(), targets._version());
    torch::jit::GraphOptimizerEnabledGuard plain(false);  // as the model's forward: eager PyTorch's ops
    c10::IValue out;
    try {
      out = module_.forward({outputs, targets});
    } catch (const c10::OutOfMemoryError&) {
      throw;
    } catch (const std::exception& e) {
      retype_out_of_memory(e);
      throw Error(fmt::format("{}: the loss failed on outputs {} ({}) and targets {} ({}): {}", file_.where(),
                              shape_text(outputs.sizes()), c10::toString(outputs.scalar_type()),
                              shape_text(targets.sizes()), c10::toString(targets.scalar_type()), error_summary(e)));
    }
    // The outputs go on to the metrics and the plugins, the targets to the metrics.
    const bool unchanged = versions == std::make_pair(outputs._version(), targets._version());
    TRAINER_CHECK_T(UsageError, unchanged, file_.where(), ": the loss changed its ",
                    versions.first != outputs._version() ? "outputs" : "targets",
                    " argument in place (an op ending in _, or an assignment into it); compute out of place, e.g. "
                    "x = x.clamp(...) instead of x.clamp_(...)");
    TRAINER_CHECK_T(UsageError, out.isTensor(), file_.where(), ": forward returned a ", out.tagKind(),
                    ", not a Tensor");
    at::Tensor y = out.toTensor();
    const std::int64_t n = outputs.size(0);
    TRAINER_CHECK_T(UsageError, y.dim() == 1 && y.size(0) == n && y.is_floating_point(), file_.where(),
                    ": the loss of outputs ", shape_text(outputs.sizes()), " returned ", shape_text(y.sizes()), " (",
                    c10::toString(y.scalar_type()), "); it must return each sample's loss, floating point [", n,
                    "] (in Python: reduction=\"none\", then a mean over any other dimension), so that the core "
                    "can weigh micro-batches and evaluate each sample exactly");
    TRAINER_CHECK_T(UsageError, !(outputs.requires_grad() && at::GradMode::is_enabled()) || y.requires_grad(),
                    file_.where(),
                    ": the loss has no gradient with respect to the outputs (it must be differentiable in them: no "
                    "argmax, comparison or .detach() between the outputs and the result)");
    return y;
  }

 private:
  std::mutex mutex_;
  torch::jit::Module module_;
  ScriptFile file_;
  c10::Device device_{c10::kCPU};
  std::optional<c10::ScalarType> dtype_;  ///< of its floating buffers once a call converted them
};

}  // namespace

SampleLoss load_torchscript_loss(const std::string& key, const std::string& file) {
  const ScriptFile f{key, file, "loss"};
  torch::jit::Module m = load_module(f);
  check_forward(m, f, 2,
                "two Tensors (the model's outputs and the targets; further arguments need defaults) and return one "
                "Tensor (each sample's loss)");
  std::vector<std::string> params;
  for (const auto& p : m.named_parameters(true)) params.push_back(p.name);
  TRAINER_CHECK_T(UsageError, params.empty(), f.where(), ": the loss has parameters (",
                  fmt::format("{}", fmt::join(params, ", ")),
                  "), which nothing would train: trainer trains the model's parameters; make them constants or "
                  "buffers (register_buffer) of the loss");
  auto loss = std::make_shared<ScriptedLoss>(std::move(m), f);
  return [loss](const at::Tensor& outputs, const at::Tensor& targets) { return (*loss)(outputs, targets); };
}

bool is_torchscript_model(const Model& model) { return dynamic_cast<const TorchScriptModel*>(&model) != nullptr; }

bool save_torchscript_module(Model& model, const std::string& path) {
  auto* scripted = dynamic_cast<TorchScriptModel*>(&model);
  if (scripted == nullptr) return false;
  scripted->save_module(path);
  return true;
}

}  // namespace trainer
