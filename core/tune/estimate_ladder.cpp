// oom_backoff's memory ladder in `trainer estimate` (estimate.h's header): the rungs' probes,
// the time model from the probes' step times, each rung's prediction and the cheapest
// configuration that fits.
#include <c10/core/Device.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "estimate_internal.h"
#include "trainer/error.h"
#include "trainer/memory.h"

namespace trainer::tune {

Probe probe_of(const ShortRunResult& r, std::int64_t batch, std::int64_t micro, std::int64_t length) {
  Probe p;
  p.batch_size = batch;
  p.micro_batch = micro;
  p.length = length;
  p.peak = r.peak();
  p.peak_forward_backward = r.peak_forward_backward();
  p.peak_optimizer_step = r.peak_optimizer_step();
  p.reserved = r.reserved();
  p.out_of_memory = r.out_of_memory;
  p.checkpointed_blocks = r.checkpointed_blocks;
  p.moment_bits = r.moment_bits;
  // Its fastest step after the first (which creates the optimizer state and fills the
  // read-ahead), or its only step.
  const std::size_t from = r.steps.size() > 1 ? 1 : 0;
  for (std::size_t i = from; i < r.steps.size(); ++i) {
    if (i == from || r.steps[i].seconds < p.forward_backward_seconds + p.optimizer_seconds) {
      p.forward_backward_seconds = r.steps[i].seconds - r.steps[i].optimizer_seconds;
      p.optimizer_seconds = r.steps[i].optimizer_seconds;
    }
  }
  return p;
}

namespace {

/// A probe that ran as the recipe is, at its own data: no saver on (the fit's and the rungs' base).
bool plain_probe(const Probe& p, const MemoryEstimate& e) {
  return p.error.empty() && p.length == 0 && p.checkpointed_blocks == 0 && p.moment_bits == e.moment_bits && !p.offload;
}

}  // namespace

/// The time model (estimate.h) from the plain probes that ran: the optimizer step is their
/// median; the forward and backward passes per micro-step and per sample by least squares,
/// neither below 0.
void fit_times(MemoryEstimate& e) {
  std::vector<double> optimizer;
  std::vector<std::vector<double>> X;
  std::vector<double> y;
  for (const auto& p : e.probes) {
    if (!plain_probe(p, e)) continue;
    optimizer.push_back(p.optimizer_seconds);
    X.push_back({double((p.batch_size + p.micro_batch - 1) / p.micro_batch), double(p.batch_size)});
    y.push_back(p.forward_backward_seconds);
  }
  if (X.size() < 2) return;
  std::sort(optimizer.begin(), optimizer.end());
  e.step_seconds = optimizer[optimizer.size() / 2];
  std::vector<double> w{0.0, 0.0};
  try {
    w = least_squares(X, y);
  } catch (const Error&) {
  }
  // One term alone where the other came out negative (noise on a busy machine).
  const auto alone = [&](std::size_t c) {
    double xy = 0, xx = 0;
    for (std::size_t i = 0; i < X.size(); ++i) xy += X[i][c] * y[i], xx += X[i][c] * X[i][c];
    return xx > 0 ? std::max(0.0, xy / xx) : 0.0;
  };
  if (w[0] < 0 || !std::isfinite(w[0])) w = {0.0, alone(1)};
  if (w[1] < 0 || !std::isfinite(w[1])) w = {alone(0), 0.0};
  e.micro_step_seconds = w[0], e.sample_seconds = w[1];
}

/// The rungs of oom_backoff's ladder that `facts` allows, probed (estimate.h): checkpointing
/// every block at the smallest and largest sizes, AdamW's moments in fewer bits and in host
/// memory (on a GPU) at the smallest.
void probe_ladder(const EstimateRequest& request, const RecipeFacts& facts, const std::vector<std::int64_t>& sizes,
                  std::int64_t model_blocks, MemoryEstimate& e) {
  // Copies: probing appends to e.probes.
  const auto plain = [&e](std::int64_t m) -> std::optional<Probe> {
    for (const auto& p : e.probes) {
      if (plain_probe(p, e) && p.batch_size == m && p.micro_batch == m) return p;
    }
    return std::nullopt;
  };
  const auto probe = [&](std::int64_t m, std::int64_t blocks, int bits, bool offload = false) -> std::optional<Probe> {
    ShortRunSpec spec;
    spec.recipe = request.recipe;
    spec.overrides = request.overrides;
    spec.plugin_dirs = request.plugin_dirs;
    spec.batch_size = m;
    spec.micro_batch = m;
    spec.steps = request.probe_steps;
    spec.checkpointed_blocks = blocks;
    spec.moment_bits = bits;
    spec.offload = offload;
    spec.work_dir = request.work_dir;
    spec.label = "estimate-rung-" + std::to_string(m) + "-" + std::to_string(blocks) + "-" + std::to_string(bits) +
                 (offload ? "-offload" : "");
    const ShortRunResult r = run_short(spec);
    Probe p = probe_of(r, m, m, 0);
    p.offload = offload;
    if (r.steps.empty()) {
      // It did not step: what it was asked for.
      p.checkpointed_blocks = blocks < 0 ? model_blocks : blocks;
      p.moment_bits = bits != 0 ? bits : e.moment_bits;
    }
    const bool ran = r.exit_code == 0 && static_cast<std::int64_t>(r.steps.size()) >= request.probe_steps;
    const std::string what = blocks != 0 ? "every block checkpointed"
                             : offload   ? "AdamW's moments in host memory"
                                         : "AdamW's moments in " + std::to_string(bits) + " bits";
    if (!ran) {
      p.error = r.message.empty() ? "ran " + std::to_string(r.steps.size()) + " steps" : r.message;
      e.notes.push_back("the probe with " + what + " at micro-batch " + std::to_string(m) + " failed (" + p.error +
                        "): that rung is left out");
    } else if (blocks != 0 && r.checkpointed_blocks != r.model_blocks) {
      p.error = "ran with " + std::to_string(r.checkpointed_blocks) + " of " + std::to_string(r.model_blocks) +
                " blocks checkpointed";
      e.notes.push_back("the probe with " + what + " " + p.error +
                        " (another plugin wraps blocks): the checkpoint "
                        "rung is left out");
    } else if (bits != 0 && r.moment_bits != bits) {
      p.error = "ran with moments in " + std::to_string(r.moment_bits) + " bits";
      e.notes.push_back("the probe with " + what + " " + p.error + ": that rung is left out");
    } else if (offload && !r.optimizer_offload) {
      p.error = "ran with the moments on " + r.device;
      e.notes.push_back("the probe with " + what + " " + p.error +
                        " (the core refused the move): that rung is left out");
    }
    e.probes.push_back(p);
    return p.error.empty() ? std::optional<Probe>(p) : std::nullopt;
  };
  // The allocator's slack on the rungs (CUDA: what the limit caps is reserved memory, and
  // recomputing or converting may leave more of it unused than the plain probes did).
  const auto note_slack = [&e](const Probe& p) { e.rung_slack = std::max(e.rung_slack, double(p.reserved - p.peak)); };
  if (facts.rung_checkpoint && model_blocks > 0) {
    // Every block checkpointed, at the two largest sizes (nearest the recipe's micro-batch, where
    // the line is used most): that line's held memory and per-sample term.
    const std::int64_t small = sizes[sizes.size() - 2], large = sizes.back();
    const auto lo = probe(small, -1, 0);
    const auto hi = lo ? probe(large, -1, 0) : std::nullopt;
    if (lo && hi) {
      const double m_lo = double(lo->micro_batch), m_hi = double(hi->micro_batch);
      const double per_sample = double(hi->peak_forward_backward - lo->peak_forward_backward) / (m_hi - m_lo);
      if (per_sample < 0 || per_sample > e.per_sample) {
        // Checkpointing keeps less per sample, never more, and never less than nothing.
        e.notes.push_back("the probes with every block checkpointed hold " + format_bytes(std::llround(per_sample)) +
                          " per sample against " + format_bytes(std::llround(e.per_sample)) +
                          " plain: not a line to predict from; the checkpoint rung is left out");
      } else {
        e.checkpointed_per_sample = per_sample;
        e.checkpointed_held = double(lo->peak_forward_backward) - per_sample * m_lo;
        e.model_blocks = model_blocks;
        note_slack(*lo);
        note_slack(*hi);
        const auto plain_lo = plain(small), plain_hi = plain(large);
        if (plain_lo && plain_hi) {
          e.checkpoint_sample_seconds =
              std::max(0.0, 0.5 * ((lo->forward_backward_seconds - plain_lo->forward_backward_seconds) / m_lo +
                                   (hi->forward_backward_seconds - plain_hi->forward_backward_seconds) / m_hi));
        } else {
          e.notes.push_back("no plain probe at micro-batch " + std::to_string(plain_lo ? large : small) +
                            " to time checkpointing against: its recomputation is not in the predicted times");
        }
      }
    }
  }
  // A moment rung: one probe at the smallest size against the plain one there.
  const auto probe_moment_rung = [&](int bits, bool offload) {
    const auto base = plain(sizes.front());
    const auto p = base ? probe(sizes.front(), 0, offload ? 0 : bits, offload) : std::nullopt;
    if (!p) return;
    MomentRung r;
    r.bits = bits;
    r.offload = offload;
    r.held_delta = double(p->peak_forward_backward - base->peak_forward_backward);
    r.step_held_delta = double(p->peak_optimizer_step - base->peak_optimizer_step);
    // Offloaded, the whole step's time: a plain step's GPU work runs on past its end (queued),
    // while the offloaded step waits for its last copy; never faster than the plain step.
    r.seconds_delta = offload ? std::max(0.0, (p->forward_backward_seconds + p->optimizer_seconds) -
                                                  (base->forward_backward_seconds + base->optimizer_seconds))
                              : p->optimizer_seconds - base->optimizer_seconds;
    e.moment_rungs.push_back(r);
    note_slack(*p);
  };
  for (const int bits : {16, 8}) {
    const bool allowed = bits == 16 ? facts.rung_bf16 : facts.rung_8bit;
    if (allowed && e.moment_bits > bits) probe_moment_rung(bits, false);  // not AdamW (0), or already as compact
  }
  // The offload rung: a GPU's. On the CPU the moments are in host memory already and oom_backoff
  // skips the rung, so it is left out without a word, as every rung that does not apply.
  if (facts.rung_offload && e.moment_bits > 0 && c10::Device(e.device).is_cuda())
    probe_moment_rung(e.moment_bits, true);
}

namespace {

/// k of N blocks checkpointed as a share of the way from the plain line to every block's.
double checkpointed_share(const MemoryEstimate& e, std::int64_t blocks) {
  return e.model_blocks > 0 ? double(std::clamp<std::int64_t>(blocks, 0, e.model_blocks)) / double(e.model_blocks)
                            : 0.0;
}

}  // namespace

const MomentRung* MemoryEstimate::moment_rung(int bits, bool offload) const {
  TRAINER_CHECK(!offload || bits == 0, "the offload rung is predicted with the recipe's moment bits only, not ", bits);
  for (const auto& r : moment_rungs) {
    if (offload ? r.offload : (!r.offload && r.bits == bits)) return &r;
  }
  return nullptr;
}

std::int64_t MemoryEstimate::predict_on_rung(std::int64_t batch, std::int64_t micro, std::int64_t blocks, int bits,
                                             bool offload) const {
  micro = std::max<std::int64_t>(1, std::min(micro, batch));
  const double f = checkpointed_share(*this, blocks);
  double held_delta = 0, step_delta = 0;
  if (const MomentRung* r = moment_rung(bits, offload)) held_delta = r->held_delta, step_delta = r->step_held_delta;
  const double l = double(length);
  const double sample =
      per_sample + per_sample_l1 * l + per_sample_l2 * l * l + f * (checkpointed_per_sample - per_sample);
  const double forward_backward =
      std::max(floor, held + f * (checkpointed_held - held) + held_delta + sample * double(micro) +
                          (per_batch_sample + per_batch_sample_l1 * l) * double(batch - micro));
  const double step = step_held + step_delta + (step_per_batch_sample + step_per_batch_sample_l1 * l) * double(batch);
  return static_cast<std::int64_t>(std::llround(std::max(forward_backward, step)));
}

std::int64_t MemoryEstimate::rung_limit_measure(std::int64_t batch, std::int64_t micro, std::int64_t blocks, int bits,
                                                bool offload) const {
  std::int64_t m = predict_on_rung(batch, micro, blocks, bits, offload);
  if (limit_on_reserved) {
    micro = std::max<std::int64_t>(1, std::min(micro, batch));
    const double l = double(length);
    double s = slack + (slack_per_sample + slack_l1 * l) * double(micro);
    if (blocks > 0 || bits != 0 || offload) s = std::max(s, rung_slack);
    m += std::max<std::int64_t>(0, std::llround(s));
  }
  return m;
}

double MemoryEstimate::predict_seconds(std::int64_t batch, std::int64_t micro, std::int64_t blocks, int bits,
                                       bool offload) const {
  micro = std::max<std::int64_t>(1, std::min(micro, batch));
  const double f = checkpointed_share(*this, blocks);
  double t = step_seconds + micro_step_seconds * double((batch + micro - 1) / micro) +
             (sample_seconds + f * checkpoint_sample_seconds) * double(batch);
  if (const MomentRung* r = moment_rung(bits, offload)) t += r->seconds_delta;
  return std::max(0.0, t);
}

namespace {

LadderConfig on_rung(const MemoryEstimate& e, std::int64_t batch, std::int64_t base_micro, std::int64_t micro,
                     std::int64_t blocks, int bits, bool offload = false) {
  LadderConfig c;
  c.micro_batch = micro;
  c.checkpointed_blocks = blocks;
  c.moment_bits = bits;
  c.offload = offload;
  c.inexact = bits != 0 && bits < e.moment_bits;
  c.peak = e.predict_on_rung(batch, micro, blocks, bits, offload);
  const double base = e.predict_seconds(batch, base_micro, 0, 0);
  c.time_ratio = base > 0 ? e.predict_seconds(batch, micro, blocks, bits, offload) / base : 0.0;
  return c;
}

}  // namespace

std::optional<LadderConfig> MemoryEstimate::cheapest_fit(std::int64_t batch, std::int64_t max_micro,
                                                         std::int64_t min_micro) const {
  if (limit <= 0 || peak == 0) return std::nullopt;
  max_micro = std::max<std::int64_t>(1, std::min(max_micro, batch));
  min_micro = std::max<std::int64_t>(1, min_micro);
  // The moments as configured, in host memory (exact), then in fewer bits (inexact).
  std::vector<std::pair<int, bool>> moments = {{0, false}};
  if (moment_rung(0, true)) moments.emplace_back(0, true);
  for (const auto& r : moment_rungs) {
    if (!r.offload) moments.emplace_back(r.bits, false);
  }
  const bool timed = predict_seconds(batch, max_micro, 0, 0) > 0;
  std::optional<LadderConfig> best;
  // Exact configurations first: moments in fewer bits only when nothing exact fits.
  for (const auto& [b, offload] : moments) {
    if (best && b != 0) break;
    for (std::int64_t k = 0; k <= model_blocks; ++k) {
      for (std::int64_t m = max_micro; m >= min_micro; --m) {
        if (rung_limit_measure(batch, m, k, b, offload) > usable(*this)) continue;
        // As many micro-steps, evenly split: as fast, with more memory left (checked: the
        // prediction need not fall with the micro-batch when the batch's rest holds more).
        const std::int64_t steps = (batch + m - 1) / m, even = (batch + steps - 1) / steps;
        if (even >= min_micro && even < m && rung_limit_measure(batch, even, k, b, offload) <= usable(*this)) m = even;
        LadderConfig c = on_rung(*this, batch, max_micro, m, k, b, offload);
        // Without step times: the fewest micro-steps, then the ladder's order (blocks
        // checkpointed, the fewest first, before the moments offloaded).
        const auto cost = [&](const LadderConfig& x) {
          return timed ? x.time_ratio
                       : double((batch + x.micro_batch - 1) / x.micro_batch) * 1e6 + double(x.checkpointed_blocks) +
                             (x.offload ? double(model_blocks + 1) : 0.0);
        };
        if (!best || cost(c) < cost(*best)) best = c;
        break;  // the largest micro-batch that fits at these savers is the cheapest of them
      }
    }
  }
  return best;
}

void set_ladder(MemoryEstimate& e) {
  e.rungs.clear();
  e.rungs.push_back(on_rung(e, e.batch_size, e.micro_batch, e.micro_batch, 0, 0));
  // Checkpointing as oom_backoff takes it: a quarter of the blocks (rounded up), twice as many, ... all.
  for (std::int64_t k = e.model_blocks > 0 ? (e.model_blocks + 3) / 4 : 0; k > 0;
       k = k >= e.model_blocks ? 0 : std::min(e.model_blocks, 2 * k)) {
    e.rungs.push_back(on_rung(e, e.batch_size, e.micro_batch, e.micro_batch, k, 0));
  }
  for (const auto& r : e.moment_rungs) {
    e.rungs.push_back(on_rung(e, e.batch_size, e.micro_batch, e.micro_batch, 0, r.offload ? 0 : r.bits, r.offload));
  }
  e.cheapest = e.cheapest_fit(e.batch_size, e.micro_batch, e.min_micro_batch);
}

/// With model.memory_format = "auto": each rung's terms in `e` as the larger of its own and
/// `other`'s (the other format's), a rung that either left out left out.
void keep_larger_rungs(MemoryEstimate& e, const MemoryEstimate& other) {
  if (other.model_blocks != e.model_blocks) {
    e.model_blocks = 0;
  } else if (e.model_blocks > 0) {
    e.checkpointed_held = std::max(e.checkpointed_held, other.checkpointed_held);
    e.checkpointed_per_sample = std::max(e.checkpointed_per_sample, other.checkpointed_per_sample);
    e.checkpoint_sample_seconds = std::max(e.checkpoint_sample_seconds, other.checkpoint_sample_seconds);
  }
  std::vector<MomentRung> both;
  for (const auto& r : e.moment_rungs) {
    for (const auto& o : other.moment_rungs) {
      if (o.bits != r.bits || o.offload != r.offload) continue;
      both.push_back({r.bits, std::max(r.held_delta, o.held_delta), std::max(r.step_held_delta, o.step_held_delta),
                      std::max(r.seconds_delta, o.seconds_delta), r.offload});
    }
  }
  e.moment_rungs = both;
  e.rung_slack = std::max(e.rung_slack, other.rung_slack);
}

}  // namespace trainer::tune
