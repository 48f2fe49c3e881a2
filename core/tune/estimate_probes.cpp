// The probes and the fit of `trainer estimate` (declared in estimate.h): estimate_memory, with
// the limit the prediction is checked against.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "estimate_internal.h"
#include "trainer/devices.h"
#include "trainer/error.h"
#include "trainer/memory.h"

namespace trainer::tune {

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

namespace {

constexpr std::int64_t kMiB = 1024 * 1024;

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
  std::vector<std::int64_t> lengths = request.lengths;
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  const bool by_length = !lengths.empty();
  if (by_length) {
    TRAINER_CHECK_T(UsageError, lengths.size() >= 3 && lengths.front() >= 1,
                    "--lengths needs at least three distinct lengths >= 1: what a sample holds grows with its "
                    "length, attention's scores with its square");
    TRAINER_CHECK_T(UsageError, facts.max_length > 0,
                    "--lengths probes dataset.max_length, every batch padded to it: the recipe's dataset has no "
                    "max_length (dataset \"text\" has)");
    e.length = facts.max_length;
    if (e.length < lengths.front() || e.length > lengths.back()) {
      e.notes.push_back("the recipe's dataset.max_length " + std::to_string(e.length) +
                        " is outside the lengths probed (" + std::to_string(lengths.front()) + " to " +
                        std::to_string(lengths.back()) + "): its prediction is extrapolated");
    }
  } else {
    lengths = {0};  // the recipe's data as it is
  }

  // Probes at batch = micro-batch, and one with a batch 4x its micro-batch: what the batch
  // itself holds (c) is told apart from what the micro-batch's forward and backward hold (b);
  // at each length.
  struct Point {
    std::int64_t batch, micro, length;
    std::size_t index;  ///< of the probe among its length's
  };
  std::vector<Point> points;
  for (const auto len : lengths) {
    // Over lengths, the same tokens per micro-batch at each length (the sizes at the longest,
    // scaled up at the shorter): each probe's activations stand out from what a step holds anyway.
    const auto at = [&](std::int64_t m) { return len > 0 ? std::max<std::int64_t>(1, m * lengths.back() / len) : m; };
    std::size_t i = 0;
    for (auto m : sizes) points.push_back({at(m), at(m), len, i++});
    points.push_back({4 * at(sizes.back()), at(sizes.back()), len, i});
  }
  ShortRunResult first;
  bool savers_known = false;
  std::int64_t model_blocks = 0;
  struct Evaluation {
    std::int64_t samples, start, peak, length;
  };
  std::vector<Evaluation> evaluations;
  for (const auto& [batch, micro, len, index] : points) {
    ShortRunSpec spec;
    spec.recipe = request.recipe;
    spec.overrides = request.overrides;
    const auto at_length = length_overrides(len, facts);
    spec.overrides.insert(spec.overrides.end(), at_length.begin(), at_length.end());
    spec.plugin_dirs = request.plugin_dirs;
    spec.batch_size = batch;
    spec.micro_batch = micro;
    spec.steps = request.probe_steps;
    spec.work_dir = request.work_dir;
    spec.label = "estimate-probe-" + std::to_string(batch) + "-" + std::to_string(micro) + "-" + std::to_string(len);
    // The first (smallest) probe also evaluates a batch of eval.batch_size, the second one of
    // half that: what an evaluation needs does not depend on the training batch, and two sizes
    // tell what grows with its batch from what does not (at each length).
    spec.evaluate = facts.eval_batch > 0 && (index == 0 || (index == 1 && facts.eval_batch >= 2));
    if (spec.evaluate) spec.eval_batch = index == 0 ? facts.eval_batch : facts.eval_batch / 2;
    const ShortRunResult r = run_short(spec);
    Probe p = probe_of(r, batch, micro, len);
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
      if (!r.out_of_memory && r.exit_code == kExitUsage) throw UsageError(r.message);
      TRAINER_CHECK(r.out_of_memory || r.exit_code == 0, "the probe at micro-batch ", micro, " (batch ", batch,
                    len > 0 ? ", length " + std::to_string(len) : std::string(), ") failed: ", p.error);
      TRAINER_CHECK(r.out_of_memory, "the probe at micro-batch ", micro, " (batch ", batch,
                    len > 0 ? ", length " + std::to_string(len) : std::string(), ") ran only ", r.steps.size(), " of ",
                    request.probe_steps, " steps: the training set is too small for it (lower the probe sizes with ",
                    "--probe-sizes", len > 0 ? "; at the shorter lengths they are scaled up to the same tokens" : "",
                    ")");
    }
    if (e.device.empty()) {
      first = r;
      e.device = r.device;
      e.plugins = r.plugins;
      e.train_samples = r.train_samples;
    }
    if (!savers_known && !r.steps.empty()) {
      // The model's blocks and the optimizer's moment bits, from the first probe that stepped.
      savers_known = true;
      model_blocks = r.model_blocks;
      e.moment_bits = r.moment_bits;
    }
    if (spec.evaluate && r.eval_samples > 0 && r.eval_peak > 0) {
      evaluations.push_back({r.eval_samples, r.eval_allocated_at_start, r.eval_peak, len});
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
  std::set<std::int64_t> eval_sizes, eval_lengths;
  for (const auto& v : evaluations) eval_sizes.insert(v.samples), eval_lengths.insert(v.length);
  if (by_length && eval_lengths.size() >= 3) {
    // Over lengths: the rise per sample is e + e_l1 L + e_l2 L^2, on top of a fixed rise where
    // two evaluation sizes tell it apart (one size: a small test split, or eval.batch_size 1).
    const bool fixed = eval_sizes.size() >= 2 && evaluations.size() >= 4;
    std::vector<std::vector<double>> Xe;
    std::vector<double> ye;
    for (const auto& v : evaluations) {
      const double n = double(v.samples), l = double(v.length);
      Xe.push_back(fixed ? std::vector<double>{1.0, n, n * l, n * l * l} : std::vector<double>{n, n * l, n * l * l});
      ye.push_back(double(v.peak - v.start));
    }
    const auto w = least_squares(Xe, ye);
    const std::size_t k = fixed ? 1 : 0;
    e.eval_batch = facts.eval_batch;
    e.eval_base = double(evaluations.front().start) + (fixed ? std::max(0.0, w[0]) : 0.0);
    e.eval_per_sample = w[k], e.eval_per_sample_l1 = w[k + 1], e.eval_per_sample_l2 = w[k + 2];
    e.eval_peak = e.predict_eval(e.eval_batch);
  } else if (by_length && !evaluations.empty()) {
    e.notes.push_back("the evaluation was measured at fewer than three lengths: it is left out of the estimate");
  } else if (!evaluations.empty()) {
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
  std::vector<double> y, ys, yo;
  // Without a length axis the L columns are left out (L = 0).
  std::set<std::int64_t> micro_sizes, accumulated_lengths;
  std::vector<const Probe*> ran;
  for (const auto& p : e.probes) {
    if (!p.error.empty()) continue;
    ran.push_back(&p);
    micro_sizes.insert(p.micro_batch);
  }
  if (by_length) {
    // Three lengths must run: the longest run out of memory first (a device: the probes have no
    // budget), and that is the answer, not a fit.
    std::set<std::int64_t> ran_lengths, oom_lengths;
    std::map<std::int64_t, std::int64_t> smallest_oom;  // length -> its smallest micro-batch out of memory
    for (const Probe* p : ran) ran_lengths.insert(p->length);
    for (const auto& p : e.probes) {
      if (!p.out_of_memory) continue;
      oom_lengths.insert(p.length);
      auto [it, added] = smallest_oom.emplace(p.length, p.micro_batch);
      if (!added) it->second = std::min(it->second, p.micro_batch);
    }
    if (ran_lengths.size() < 3) {
      std::string which;
      for (const auto& [len, m] : smallest_oom) {
        which += (which.empty() ? "" : ", ") + std::to_string(len) + " (micro-batch " + std::to_string(m) + ")";
      }
      TRAINER_CHECK_T(UsageError, false, "--lengths: the probes at length ", which, " ran out of memory on ",
                      e.device.empty() ? std::string("the device") : e.device,
                      " (without a budget): a step of that length does not fit there even at that micro-batch; "
                      "the fit needs three lengths that run: probe shorter lengths or smaller --probe-sizes");
    }
    if (!oom_lengths.empty()) {
      e.notes.push_back("some probes ran out of memory (at length " + std::to_string(*oom_lengths.rbegin()) +
                        " and maybe others): the fit rests on those that ran");
    }
  }
  // Over lengths, a floor: in a step without accumulation the gradients are created during the
  // backward pass as the activations are freed, so a small step's peak is what the step holds
  // anyway plus the gradients (the same at every size), a large one's the activations. The floor
  // is that sum, as the first probe measured it (held at its start, optimizer state, gradients);
  // the probes on it (within 2 %, or where the line without them falls below it) stay out of the
  // line when enough remain; the forward and backward is then the larger of the two.
  // A probe's row of the forward and backward's line: 1, micro, micro L, micro L^2,
  // (batch - micro), (batch - micro) L, the L columns and those of the batch's rest as asked.
  const auto line_row = [](const Probe* p, bool lengths, bool rest, bool rest_by_length) {
    const double m = double(p->micro_batch), r = double(p->batch_size - p->micro_batch), l = double(p->length);
    std::vector<double> row = {1.0, m};
    if (lengths) row.insert(row.end(), {m * l, m * l * l});
    if (rest) row.push_back(r);
    if (rest_by_length) row.push_back(r * l);
    return row;
  };
  std::vector<const Probe*> fitted = ran;
  if (by_length && !ran.empty()) {
    const double floor = double(first.allocated_at_start + first.optimizer_bytes + first.gradient_bytes);
    std::vector<const Probe*> above;
    for (const Probe* p : ran) {
      if (double(p->peak_forward_backward) > 1.02 * floor) above.push_back(p);
    }
    const auto enough = [](const std::vector<const Probe*>& v) {
      std::set<std::int64_t> lengths, sizes;
      for (const Probe* p : v) lengths.insert(p->length), sizes.insert(p->micro_batch);
      return v.size() >= 8 && lengths.size() >= 3 && sizes.size() >= 2;
    };
    // Then, the probes the line (of the others) puts below the floor, until none is left.
    for (int round = 0; round < 5 && enough(above); ++round) {
      std::vector<std::vector<double>> Xa;
      std::vector<double> ya;
      for (const Probe* p : above) {
        Xa.push_back(line_row(p, true, true, false));
        ya.push_back(double(p->peak_forward_backward));
      }
      std::vector<double> w;
      try {
        w = least_squares(Xa, ya);
      } catch (const Error&) {
        break;
      }
      std::vector<const Probe*> kept;
      for (std::size_t i = 0; i < above.size(); ++i) {
        double line = 0;
        for (std::size_t c = 0; c < w.size(); ++c) line += w[c] * Xa[i][c];
        if (line >= floor) kept.push_back(above[i]);
      }
      if (kept.size() == above.size() || !enough(kept)) break;
      above = kept;
    }
    if (enough(above)) {
      fitted = above;
      e.floor = floor;
    } else {
      e.notes.push_back(
          "too few probes rose above the floor (held memory and gradients) to fit the line without "
          "the others");
    }
  }
  for (const Probe* p : fitted) {
    if (p->batch_size > p->micro_batch) accumulated_lengths.insert(p->length);
  }
  const bool accumulated = !accumulated_lengths.empty();
  const bool accumulated_by_length = by_length && accumulated_lengths.size() >= 2;
  for (const Probe* p : fitted) {
    const double m = double(p->micro_batch), l = double(p->length);
    X.push_back(line_row(p, by_length, accumulated, accumulated_by_length));
    y.push_back(double(p->peak_forward_backward));
    Xo.push_back(by_length ? std::vector<double>{1.0, double(p->batch_size), double(p->batch_size) * l}
                           : std::vector<double>{1.0, double(p->batch_size)});
    yo.push_back(double(p->peak_optimizer_step));
    Xs.push_back(by_length ? std::vector<double>{1.0, m, m * l} : std::vector<double>{1.0, m});
    ys.push_back(double(p->reserved - p->peak));
  }
  set_limit(e, facts.memory);
  if (micro_sizes.size() < 2) {
    // The smallest probe ran out of memory: the recipe's larger step cannot fit either.
    TRAINER_CHECK(e.probes.front().out_of_memory, "only ", X.size(),
                  " probe(s) ran, the others ran out of memory: too few to fit; give smaller --probe-sizes");
    e.fits = false;
    e.notes.push_back("the smallest probe (micro-batch " + std::to_string(e.probes.front().micro_batch) +
                      ") ran out of memory");
    return e;
  }
  if (by_length && accumulated && !accumulated_by_length) {
    e.notes.push_back(
        "the probes of a batch 4x its micro-batch ran at one length only: what the rest of a batch holds is "
        "taken not to grow with the length");
  }
  if (!accumulated) {
    // The probe with a batch 4x its micro-batch ran out of memory: what the rest of a batch holds
    // cannot be told apart, and is taken as nothing.
    e.notes.push_back(
        "the probe of a batch 4x its micro-batch ran out of memory: the rest of a batch split "
        "into micro-batches is taken to hold nothing (c = 0)");
  }
  const auto w = least_squares(X, y);
  std::size_t k = 0;
  e.held = w[k++], e.per_sample = w[k++];
  if (by_length) e.per_sample_l1 = w[k++], e.per_sample_l2 = w[k++];
  if (accumulated) e.per_batch_sample = w[k++];
  if (accumulated_by_length) e.per_batch_sample_l1 = w[k++];
  const auto wo = least_squares(Xo, yo);
  e.step_held = wo[0], e.step_per_batch_sample = wo[1];
  if (by_length) e.step_per_batch_sample_l1 = wo[2];
  const auto s = least_squares(Xs, ys);
  e.slack = s[0], e.slack_per_sample = s[1];
  if (by_length) e.slack_l1 = s[2];
  for (const Probe* p : ran) {
    const double measured = double(p->peak);
    const double predicted = double(e.predict_at(p->batch_size, p->micro_batch, p->length));
    e.fit_residual = std::max(e.fit_residual, std::fabs(measured - predicted) / std::max(1.0, measured));
  }

  e.peak = e.predict(e.batch_size, e.micro_batch);
  e.reserved = e.predict_reserved(e.batch_size, e.micro_batch);
  e.run_peak = std::max(e.peak, e.eval_peak);
  e.parameters = first.parameter_bytes;
  e.gradients = first.gradient_bytes;
  e.optimizer_state = first.optimizer_bytes;
  e.resident = std::max<std::int64_t>(0, first.allocated_at_start - first.parameter_bytes);
  e.batch_memory =
      std::max<std::int64_t>(0, std::llround((e.per_batch_sample + e.per_batch_sample_l1 * double(e.length)) *
                                             double(e.batch_size - e.micro_batch)));
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
  fit_times(e);
  if (facts.min_micro_batch > 0) {
    // oom_backoff's ladder: the rungs it may take, and the cheapest configuration on them.
    e.min_micro_batch = facts.min_micro_batch;
    if (!by_length) {
      // (`ran` and `fitted` point into e.probes, which the ladder's probes append to: not used
      // from here on.)
      probe_ladder(request, facts, sizes, model_blocks, e);
    } else if (facts.rung_checkpoint || facts.rung_bf16 || facts.rung_8bit || facts.rung_offload) {
      e.notes.push_back("--lengths: the ladder's rungs beyond the micro-batch are not probed over lengths");
    }
    set_ladder(e);
  }
  if (by_length) {
    for (const auto len : lengths) {
      MemoryEstimate::AtLength a;
      a.length = len;
      a.peak = e.predict_at(e.batch_size, e.micro_batch, len);
      a.eval_peak = e.predict_eval_at(e.eval_batch, len);
      if (e.limit > 0) {
        const std::int64_t budget = usable(e), cap = std::max<std::int64_t>(1, e.train_samples);
        a.max_micro_batch = largest_fitting([&](std::int64_t m) { return limit_measure(e, m, m, len); }, budget, cap);
        a.max_micro_at_batch = largest_fitting([&](std::int64_t m) { return limit_measure(e, e.batch_size, m, len); },
                                               budget, e.batch_size);
      }
      e.by_length.push_back(a);
    }
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
  MemoryEstimate best, other;  // other: the format not kept
  for (const char* format : {"contiguous", "channels_last"}) {
    EstimateRequest r = request;
    r.overrides.push_back(std::string("model.memory_format=") + format);
    MemoryEstimate e = estimate_once(r, facts);
    e.probe_overrides = {r.overrides.back()};
    e.notes.push_back(std::string("model.memory_format = \"auto\": probed ") + format + ", predicted peak " +
                      format_bytes(e.peak));
    if (best.device.empty() || e.run_peak > best.run_peak) {
      e.notes.insert(e.notes.begin(), best.notes.begin(), best.notes.end());
      other = std::move(best);
      best = std::move(e);
    } else {
      best.notes.push_back(e.notes.back());
      other = std::move(e);
    }
  }
  best.notes.push_back("the larger prediction is the estimate: the run picks either by timing them");
  if (!best.rungs.empty()) {
    // The ladder too must hold whichever the run picks: each rung's terms as the larger of the
    // two formats' (a rung left out of either is left out).
    keep_larger_rungs(best, other);
    set_ladder(best);
  }
  return best;
}

}  // namespace trainer::tune
