// The probes and the fit of `trainer estimate` (declared in estimate.h): estimate_memory, with
// the limit the prediction is checked against.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "estimate_internal.h"
#include "trainer/devices.h"
#include "trainer/error.h"
#include "trainer/memory.h"

namespace trainer::tune {
namespace {

constexpr std::int64_t kMiB = 1024 * 1024;

/// Least squares for y = X w (LAPACK's SVD-based gelsd through LibTorch). A term the probes
/// cannot tell apart from the others (X of lower rank than its columns) is an error, not a
/// zero.
std::vector<double> least_squares(const std::vector<std::vector<double>>& X, const std::vector<double>& y) {
  const auto rows = static_cast<std::int64_t>(X.size()), k = static_cast<std::int64_t>(X.front().size());
  at::Tensor A = at::empty({rows, k}, at::kDouble), b = at::empty({rows, 1}, at::kDouble);
  auto a_ = A.accessor<double, 2>();
  auto b_ = b.accessor<double, 2>();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = 0; i < k; ++i) a_[r][i] = X[std::size_t(r)][std::size_t(i)];
    b_[r][0] = y[std::size_t(r)];
  }
  const auto fit = at::linalg_lstsq(A, b, c10::nullopt, c10::string_view("gelsd"));
  TRAINER_CHECK(std::get<2>(fit).item<std::int64_t>() == k, "the probes cannot separate the terms of the memory model");
  const at::Tensor w = std::get<0>(fit).contiguous();
  return std::vector<double>(w.data_ptr<double>(), w.data_ptr<double>() + k);
}

void set_limit(MemoryEstimate& e, const MemorySettings& m) {
  const c10::Device device(e.device);
  e.limit_on_reserved = device.is_cuda();
  std::int64_t total = -1, free = -1;
  if (device.is_cuda()) {
    for (const auto& g : device_inventory()->snapshot().gpus) {
      if (g.index == device.index()) total = g.total, free = g.free;
    }
  } else {
    const HostMemory h = host_memory();
    total = h.total;
    free = h.available;
  }
  std::ostringstream src;
  if (m.limit_mb > 0) {
    e.limit = static_cast<std::int64_t>(m.limit_mb * kMiB);
    src << "memory.limit_mb = " << m.limit_mb;
  } else if (m.fraction > 0 && total > 0) {
    e.limit = static_cast<std::int64_t>(m.fraction * static_cast<double>(total));
    src << "memory.fraction = " << m.fraction << " of " << format_bytes(total);
  } else if (free > 0) {
    e.limit = free;
    src << (device.is_cuda() ? "free memory of " + e.device + " now" : std::string("available host memory now"));
  }
  e.limit_source = src.str();
}

MemoryEstimate estimate_once(const EstimateRequest& request, const RecipeFacts& facts) {
  MemoryEstimate e;
  e.batch_size = facts.batch;
  e.micro_batch = facts.micro;
  e.margin = request.margin;
  TRAINER_CHECK_T(UsageError, request.margin >= 0 && request.margin < 1, "--margin ", request.margin,
                  " is outside [0, 1): it is the fraction of the limit kept free");
  std::vector<std::int64_t> sizes = request.probe_sizes;
  if (sizes.empty()) sizes = default_probe_sizes(facts.micro);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  TRAINER_CHECK_T(UsageError, sizes.size() >= 2 && sizes.front() >= 1,
                  "the probes need at least two distinct micro-batch sizes >= 1");

  // Probes at batch = micro-batch, and one with a batch 4x its micro-batch: what the batch
  // itself holds (c) is told apart from what the micro-batch's forward and backward hold (b).
  std::vector<std::pair<std::int64_t, std::int64_t>> points;  // (batch, micro)
  for (auto m : sizes) points.emplace_back(m, m);
  points.emplace_back(4 * sizes.back(), sizes.back());
  ShortRunResult first;
  struct Evaluation {
    std::int64_t samples, start, peak;
  };
  std::vector<Evaluation> evaluations;
  for (const auto& [batch, micro] : points) {
    ShortRunSpec spec;
    spec.recipe = request.recipe;
    spec.overrides = request.overrides;
    spec.plugin_dirs = request.plugin_dirs;
    spec.batch_size = batch;
    spec.micro_batch = micro;
    spec.steps = request.probe_steps;
    spec.run_dir = probe_dir(request, "probe-" + std::to_string(batch) + "-" + std::to_string(micro));
    // The first (smallest) probe also evaluates a batch of eval.batch_size, the second one of
    // half that: what an evaluation needs does not depend on the training batch, and two sizes
    // tell what grows with its batch from what does not.
    const std::size_t index = e.probes.size();
    spec.evaluate = facts.eval_batch > 0 && (index == 0 || (index == 1 && facts.eval_batch >= 2));
    if (spec.evaluate) spec.eval_batch = index == 0 ? facts.eval_batch : facts.eval_batch / 2;
    const ShortRunResult r = run_short(spec);
    Probe p;
    p.batch_size = batch;
    p.micro_batch = micro;
    p.peak = r.peak();
    p.peak_forward_backward = r.peak_forward_backward();
    p.peak_optimizer_step = r.peak_optimizer_step();
    p.reserved = r.reserved();
    p.out_of_memory = r.out_of_memory;
    // Out of memory in the evaluation after all its steps ran (a device: the probes have no
    // budget): the steps are measured all the same; the evaluation at that size cannot fit.
    const bool steps_ran = static_cast<std::int64_t>(r.steps.size()) >= request.probe_steps;
    const bool eval_oom = r.out_of_memory && r.oom_phase == OomPhase::Eval && steps_ran;
    if (eval_oom) {
      p.out_of_memory = false;
      e.notes.push_back("the evaluation at eval.batch_size " + std::to_string(spec.eval_batch) +
                        " ran out of memory on " + r.device + " without a budget: it cannot fit there");
    } else if (r.exit_code != 0 || !steps_ran) {
      p.error = r.message.empty() ? "ran " + std::to_string(r.steps.size()) + " steps" : r.message;
      TRAINER_CHECK(r.out_of_memory || r.exit_code == 0, "the probe at micro-batch ", micro, " (batch ", batch,
                    ") failed: ", p.error);
      TRAINER_CHECK(r.out_of_memory, "the probe at micro-batch ", micro, " (batch ", batch, ") ran only ",
                    r.steps.size(), " of ", request.probe_steps,
                    " steps: the training set is too small for it (lower the probe sizes with --probe-sizes)");
    }
    if (e.device.empty()) {
      first = r;
      e.device = r.device;
      e.plugins = r.plugins;
      e.train_samples = r.train_samples;
    }
    if (spec.evaluate && r.eval_samples > 0 && r.eval_peak > 0) {
      evaluations.push_back({r.eval_samples, r.eval_allocated_at_start, r.eval_peak});
      if (index == 0 && r.eval_samples < facts.eval_batch) e.test_samples = r.eval_samples;  // a small test split
    } else if (spec.evaluate && !eval_oom) {
      e.notes.push_back("the evaluation at eval.batch_size " + std::to_string(spec.eval_batch) +
                        " was not measured: the probe did not reach it");
    }
    e.probes.push_back(p);
  }
  TRAINER_CHECK(!e.device.empty() && has_memory_backend(c10::Device(e.device)), "no memory accounting for device '",
                e.device, "' in this build (a CUDA device needs a LibTorch with CUDA)");
  // The evaluation: held at its start (the first probe's), plus a rise per sample of its batch
  // and a rise that does not grow with it (caches, workspaces), told apart by the two sizes.
  if (!evaluations.empty()) {
    const Evaluation& one = evaluations.front();
    double per_sample = double(one.peak - one.start) / double(one.samples), fixed = 0;
    if (evaluations.size() == 2 && evaluations[1].samples != one.samples) {
      const Evaluation& two = evaluations[1];
      const double slope = double((one.peak - one.start) - (two.peak - two.start)) / double(one.samples - two.samples);
      if (slope >= 0) {
        per_sample = slope;
        fixed = std::max(0.0, double(one.peak - one.start) - slope * double(one.samples));
      }
    }
    e.eval_batch = facts.eval_batch;
    e.eval_base = double(one.start) + fixed;
    e.eval_per_sample = per_sample;
    e.eval_peak = e.predict_eval(e.eval_batch);
  }

  // Fit on the probes that ran.
  std::vector<std::vector<double>> X, Xs, Xo;
  std::vector<double> y, ys, yo, measured;
  for (const auto& p : e.probes) {
    if (!p.error.empty()) continue;
    X.push_back({1.0, double(p.micro_batch), double(p.batch_size - p.micro_batch)});
    y.push_back(double(p.peak_forward_backward));
    Xo.push_back({1.0, double(p.batch_size)});
    yo.push_back(double(p.peak_optimizer_step));
    measured.push_back(double(p.peak));
    Xs.push_back({1.0, double(p.micro_batch)});
    ys.push_back(double(p.reserved - p.peak));
  }
  set_limit(e, facts.memory);
  std::set<std::int64_t> micro_sizes;
  bool accumulated = false;
  for (const auto& x : X) {
    micro_sizes.insert(std::int64_t(x[1]));
    accumulated |= x[2] > 0;
  }
  if (micro_sizes.size() < 2) {
    // The smallest probe ran out of memory: the recipe's larger step cannot fit either.
    TRAINER_CHECK(e.probes.front().out_of_memory, "only ", X.size(),
                  " probe(s) ran, the others ran out of memory: too few to fit; give smaller --probe-sizes");
    e.fits = false;
    e.notes.push_back("the smallest probe (micro-batch " + std::to_string(e.probes.front().micro_batch) +
                      ") ran out of memory");
    return e;
  }
  if (!accumulated) {
    // The probe with a batch 4x its micro-batch ran out of memory: what the rest of a batch holds
    // cannot be told apart, and is taken as nothing.
    for (auto& x : X) x.pop_back();
    e.notes.push_back(
        "the probe of a batch 4x its micro-batch ran out of memory: the rest of a batch split "
        "into micro-batches is taken to hold nothing (c = 0)");
  }
  const auto w = least_squares(X, y);
  e.held = w[0], e.per_sample = w[1], e.per_batch_sample = accumulated ? w[2] : 0.0;
  const auto wo = least_squares(Xo, yo);
  e.step_held = wo[0], e.step_per_batch_sample = wo[1];
  const auto s = least_squares(Xs, ys);
  e.slack = s[0], e.slack_per_sample = s[1];
  for (std::size_t i = 0; i < X.size(); ++i) {
    const double fitted =
        double(e.predict(std::int64_t(X[i][1] + (accumulated ? X[i][2] : 0.0)), std::int64_t(X[i][1])));
    e.fit_residual = std::max(e.fit_residual, std::fabs(measured[i] - fitted) / std::max(1.0, measured[i]));
  }

  e.peak = e.predict(e.batch_size, e.micro_batch);
  e.reserved = e.predict_reserved(e.batch_size, e.micro_batch);
  e.run_peak = std::max(e.peak, e.eval_peak);
  e.parameters = first.parameter_bytes;
  e.gradients = first.gradient_bytes;
  e.optimizer_state = first.optimizer_bytes;
  e.resident = std::max<std::int64_t>(0, first.allocated_at_start - first.parameter_bytes);
  e.batch_memory = std::max<std::int64_t>(0, std::llround(e.per_batch_sample * double(e.batch_size - e.micro_batch)));
  e.activations = e.peak - e.parameters - e.gradients - e.optimizer_state - e.resident - e.batch_memory;

  if (e.limit > 0) {
    const std::int64_t budget = usable(e);
    const std::int64_t cap = std::max<std::int64_t>(1, e.train_samples);
    e.fits = e.fits_at(e.batch_size, e.micro_batch) && e.eval_fits_at(e.eval_batch);
    e.max_micro_batch = largest_fitting([&](std::int64_t m) { return limit_measure(e, m, m); }, budget, cap);
    e.max_micro_at_batch =
        largest_fitting([&](std::int64_t m) { return limit_measure(e, e.batch_size, m); }, budget, e.batch_size);
  } else {
    e.fits = true;
  }
  return e;
}

}  // namespace

MemoryEstimate estimate_memory(const EstimateRequest& request) {
  const RecipeFacts facts = recipe_facts(request);
  if (!facts.memory_format_auto) return estimate_once(request, facts);
  // NOTE: with model.memory_format = "auto" each run picks NCHW or NHWC by timing them, so two
  // runs of one recipe may differ; the activations differ between the two. Probe both and keep
  // the larger, which holds whichever the run picks.
  MemoryEstimate best;
  for (const char* format : {"contiguous", "channels_last"}) {
    EstimateRequest r = request;
    r.overrides.push_back(std::string("model.memory_format=") + format);
    MemoryEstimate e = estimate_once(r, facts);
    e.probe_overrides = {r.overrides.back()};
    e.notes.push_back(std::string("model.memory_format = \"auto\": probed ") + format + ", predicted peak " +
                      format_bytes(e.peak));
    if (best.device.empty() || e.run_peak > best.run_peak) {
      e.notes.insert(e.notes.begin(), best.notes.begin(), best.notes.end());
      best = std::move(e);
    } else {
      best.notes.push_back(e.notes.back());
    }
  }
  best.notes.push_back("the larger prediction is the estimate: the run picks either by timing them");
  return best;
}

}  // namespace trainer::tune
