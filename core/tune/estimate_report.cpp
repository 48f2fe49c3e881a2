#include "estimate.h"

#include <cmath>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "trainer/error.h"
#include "trainer/memory.h"

// What `trainer estimate` prints: the text report and the JSON that `trainer sweep` reads.
namespace trainer::tune {
namespace {

using json = nlohmann::json;

}  // namespace

namespace {

/// The savers `c` has on beyond the micro-batch ("6 of 12 blocks checkpointed, AdamW's moments
/// in host memory"); empty for none.
std::string savers_of(const MemoryEstimate& e, const LadderConfig& c) {
  std::string s;
  const auto add = [&s](const std::string& what) { s += (s.empty() ? "" : ", ") + what; };
  if (c.checkpointed_blocks > 0) {
    add(std::to_string(c.checkpointed_blocks) + " of " + std::to_string(e.model_blocks) + " blocks checkpointed");
  }
  if (c.moment_bits > 0) {
    add("AdamW's moments in " + std::to_string(c.moment_bits) + " bits" + (c.inexact ? " (inexact)" : ""));
  }
  if (c.offload) add("AdamW's moments in host memory");
  return s;
}

}  // namespace

std::string describe_config(const MemoryEstimate& e, const LadderConfig& c) {
  const std::string savers = savers_of(e, c);
  return "micro-batch " + std::to_string(c.micro_batch) + (savers.empty() ? "" : " with " + savers);
}

std::string ratio_text(double r) {
  if (r <= 0) return "step time unknown";
  std::ostringstream s;
  s << "est. " << std::fixed << std::setprecision(2) << r << "x step time";
  return s.str();
}

namespace {

void print_ladder(const MemoryEstimate& e, std::ostream& out) {
  if (e.rungs.empty()) return;  // no oom_backoff
  if (e.has_ladder()) {
    out << "  oom_backoff's ladder at micro-batch " << e.micro_batch
        << " (each saver alone; predicted peak allocated, time per step against the recipe's):\n";
    for (const auto& c : e.rungs) {
      const std::string savers = savers_of(e, c);
      const std::string what = savers.empty() ? "as configured" : savers;
      out << "    " << std::left << std::setw(40) << what << std::right << std::setw(12) << format_bytes(c.peak)
          << "   " << ratio_text(c.time_ratio) << "\n";
    }
  }
  if (e.limit <= 0) return;
  const auto usable = static_cast<std::int64_t>(double(e.limit) * (1.0 - e.margin));
  if (e.cheapest) {
    const auto& c = *e.cheapest;
    out << "  cheapest step that fits (micro-batches " << e.min_micro_batch << " to " << e.micro_batch
        << (e.has_ladder() ? ", the rungs above" : "") << "): " << describe_config(e, c) << ": "
        << ratio_text(c.time_ratio) << " (predicted "
        << format_bytes(
               e.rung_limit_measure(e.batch_size, c.micro_batch, c.checkpointed_blocks, c.moment_bits, c.offload))
        << (e.limit_on_reserved ? " reserved" : "") << " <= " << format_bytes(usable) << " usable)\n";
  } else if (e.min_micro_batch > e.micro_batch) {
    out << "  oom_backoff's min_micro_batch " << e.min_micro_batch << " is above the recipe's micro-batch "
        << e.micro_batch << ": no micro-batch for the ladder to try\n";
  } else {
    out << "  no step fits on oom_backoff's ladder (micro-batches " << e.min_micro_batch << " to " << e.micro_batch
        << (e.has_ladder() ? ", the rungs above" : "") << ")\n";
  }
}

json ladder_json(const LadderConfig& c) {
  return {{"micro_batch_size", c.micro_batch},
          {"checkpointed_blocks", c.checkpointed_blocks},
          {"moment_bits", c.moment_bits},
          {"peak_bytes", c.peak},
          {"time_ratio", c.time_ratio},
          {"inexact", c.inexact},
          {"offload", c.offload}};
}

LadderConfig ladder_from_json(const json& j) {
  LadderConfig c;
  c.micro_batch = j.at("micro_batch_size");
  c.checkpointed_blocks = j.at("checkpointed_blocks");
  c.moment_bits = j.at("moment_bits");
  c.peak = j.at("peak_bytes");
  c.time_ratio = j.at("time_ratio");
  c.inexact = j.at("inexact");
  c.offload = j.value("offload", false);
  return c;
}

}  // namespace

std::string describe_fit(const MemoryEstimate& e) {
  const auto term = [](double v, const char* what) {
    return std::fabs(v) < 1.0 ? std::string()
                              : (v >= 0 ? " + " : " - ") + format_bytes(std::llround(std::fabs(v))) + what;
  };
  std::ostringstream s;
  s << "peak = the larger of forward/backward ";
  if (e.floor > 0) s << "(at least " << format_bytes(std::llround(e.floor)) << ") ";
  s << format_bytes(std::llround(e.held)) << term(e.per_sample, " x micro-batch")
    << term(e.per_sample_l1, " x micro-batch x L") << term(e.per_sample_l2, " x micro-batch x L^2")
    << term(e.per_batch_sample, " x (batch - micro-batch)")
    << term(e.per_batch_sample_l1, " x (batch - micro-batch) x L") << " and optimizer step "
    << format_bytes(std::llround(e.step_held)) << term(e.step_per_batch_sample, " x batch")
    << term(e.step_per_batch_sample_l1, " x batch x L");
  if (e.length > 0) s << ", L the sequence length (dataset.max_length " << e.length << ")";
  return s.str();
}

std::vector<BreakdownRow> compare_breakdown(const MemoryEstimate& e, std::int64_t batch, std::int64_t micro,
                                            const MemoryBreakdown& m) {
  using C = MemoryCategory;
  const std::int64_t peak = e.predict(batch, micro);
  const std::int64_t held = e.parameters + e.optimizer_state + e.resident;
  return {
      {"parameters and buffers", e.parameters, m[C::Parameters]},
      {"optimizer state", e.optimizer_state, m[C::OptimizerState]},
      {"data held on the device", e.resident, m[C::Dataset] + m[C::Evaluation]},
      {"gradients, activations, temporaries, batch", peak - held,
       m[C::Gradients] + m[C::Activations] + m[C::Other] + m[C::Batch]},
      {"step peak", peak, m.allocated},
  };
}

void print_estimate(const MemoryEstimate& e, std::ostream& out) {
  out << "memory estimate on " << e.device << ": batch " << e.batch_size << ", micro-batch " << e.micro_batch << "\n";
  out << "  probes (real steps, no budget):";
  for (const auto& p : e.probes) {
    out << "\n    micro-batch " << std::setw(5) << p.micro_batch << ", batch " << std::setw(5) << p.batch_size;
    if (p.length > 0) out << ", length " << std::setw(5) << p.length;
    if (p.checkpointed_blocks > 0) out << ", " << p.checkpointed_blocks << " blocks checkpointed";
    if (p.moment_bits > 0 && p.moment_bits != e.moment_bits) out << ", moments in " << p.moment_bits << " bits";
    if (p.offload) out << ", moments in host memory";
    out << ": ";
    if (p.error.empty()) {
      out << format_bytes(p.peak) << " peak (forward/backward " << format_bytes(p.peak_forward_backward)
          << ", optimizer step " << format_bytes(p.peak_optimizer_step) << ")";
    } else {
      out << (p.out_of_memory ? "out of memory: " : "failed: ") << p.error;
    }
  }
  out << "\n";
  for (const auto& n : e.notes) out << "  " << n << "\n";
  if (!e.plugins.empty()) {
    out << "  plugins in the probes (what they change is measured): ";
    for (std::size_t i = 0; i < e.plugins.size(); ++i) out << (i ? ", " : "") << e.plugins[i];
    out << "\n";
  }
  if (e.peak == 0) {
    out << "  the probes ran out of memory at the small sizes: the recipe's step cannot fit on " << e.device << "\n";
    return;
  }
  out << "  fit: " << describe_fit(e) << " (largest probe residual " << std::fixed << std::setprecision(2)
      << 100.0 * e.fit_residual << " %)\n\n";
  const auto row = [&out](const std::string& what, std::int64_t bytes, const std::string& note = "") {
    out << "  " << std::left << std::setw(34) << what << std::right << std::setw(12) << format_bytes(bytes)
        << (note.empty() ? "" : "   " + note) << "\n";
  };
  row("parameters and buffers", e.parameters);
  row("gradients", e.gradients);
  row("optimizer state", e.optimizer_state);
  row("data and other memory at the start", e.resident, "data sets held on this device, the process");
  row("rest of the batch", e.batch_memory, "the batch beyond its micro-batch, where it lives on this device");
  row("activations and temporaries", e.activations, "at the step's peak");
  row("predicted step peak", e.peak, "a training step's highest point");
  row("predicted reserved", e.reserved, "with the allocator's slack");
  if (e.eval_batch > 0) {
    const double l = double(e.length);
    const double per_sample = e.eval_per_sample + e.eval_per_sample_l1 * l + e.eval_per_sample_l2 * l * l;
    row("evaluation peak", e.eval_peak,
        "eval.batch_size " + std::to_string(e.eval_batch) + ": " + format_bytes(std::llround(e.eval_base)) + " + " +
            format_bytes(std::llround(per_sample)) + " x sample" +
            (e.length > 0 ? " at length " + std::to_string(e.length) : std::string()));
  }
  row("predicted run peak", e.run_peak, "memory_log's memory/peak_mb (steps and evaluations)");
  out << "\n";
  if (e.limit <= 0) {
    out << "  limit: unknown (no budget, and the device does not report its free memory)\n";
  } else {
    const auto budget = static_cast<std::int64_t>(double(e.limit) * (1.0 - e.margin));
    out << "  limit: " << format_bytes(e.limit) << " (" << e.limit_source << "), margin " << std::setprecision(0)
        << 100.0 * e.margin << " % -> " << format_bytes(budget) << " usable"
        << (e.limit_on_reserved ? " (reserved)" : "") << "\n";
    const bool step_fits = e.fits_at(e.batch_size, e.micro_batch);
    out << "  the recipe's micro-batch " << e.micro_batch << (step_fits ? " fits" : " does NOT fit") << ": predicted "
        << format_bytes(e.limit_on_reserved ? e.reserved : e.peak) << (step_fits ? " <= " : " > ")
        << format_bytes(budget) << "\n";
    out << "  largest micro-batch that fits: " << e.max_micro_batch << " (batch = micro-batch); at batch_size "
        << e.batch_size << ": " << e.max_micro_at_batch << "\n";
    if (e.eval_batch > 0) {
      const bool ok = e.eval_fits_at(e.eval_batch);
      out << "  evaluation at eval.batch_size " << e.eval_batch << (ok ? " fits" : " does NOT fit") << ": predicted "
          << format_bytes(e.eval_peak) << (ok ? " <= " : " > ") << format_bytes(budget)
          << "; largest eval.batch_size that fits: " << e.max_eval_batch() << "\n";
    }
  }
  if (!e.by_length.empty()) {
    // The largest micro-batches need a limit: "-" without one.
    const auto micro = [&e](std::int64_t m) { return e.limit > 0 ? std::to_string(m) : std::string("-"); };
    out << "  by sequence length (dataset.max_length, every batch padded to it: what dynamic padding needs at "
           "most):\n"
        << "    length   step peak   largest micro-batch   at batch_size " << e.batch_size
        << (e.eval_batch > 0 ? "   evaluation peak" : "") << "\n";
    for (const auto& a : e.by_length) {
      out << "    " << std::setw(6) << a.length << "   " << std::setw(9) << format_bytes(a.peak) << "   "
          << std::setw(19) << micro(a.max_micro_batch) << "   " << std::setw(13 + std::to_string(e.batch_size).size())
          << micro(a.max_micro_at_batch);
      if (e.eval_batch > 0) out << "   " << std::setw(15) << format_bytes(a.eval_peak);
      out << "\n";
    }
  }
  print_ladder(e, out);
  if (e.found_max_micro_batch >= 0) {
    out << "  --find-max-batch (real steps inside the limit, no margin):";
    for (const auto& [m, ok] : e.search) out << " " << m << (ok ? " ok," : " OOM,");
    out << "\n    largest micro-batch that ran: " << e.found_max_micro_batch << "\n";
  }
}

void print_estimate_json(const MemoryEstimate& e, std::ostream& out) {
  json j;
  j["device"] = e.device;
  j["batch_size"] = e.batch_size;
  j["micro_batch_size"] = e.micro_batch;
  j["fit"] = {{"a", e.held},
              {"b", e.per_sample},
              {"c", e.per_batch_sample},
              {"a2", e.step_held},
              {"c2", e.step_per_batch_sample},
              {"slack0", e.slack},
              {"slack1", e.slack_per_sample},
              {"residual", e.fit_residual},
              {"b_l1", e.per_sample_l1},
              {"b_l2", e.per_sample_l2},
              {"c_l1", e.per_batch_sample_l1},
              {"c2_l1", e.step_per_batch_sample_l1},
              {"slack_l1", e.slack_l1},
              {"floor", e.floor}};
  j["length"] = e.length;
  j["by_length"] = json::array();
  for (const auto& a : e.by_length) {
    j["by_length"].push_back({{"length", a.length},
                              {"peak_bytes", a.peak},
                              {"max_micro_batch", a.max_micro_batch},
                              {"max_micro_batch_at_batch_size", a.max_micro_at_batch},
                              {"eval_peak_bytes", a.eval_peak}});
  }
  j["probes"] = json::array();
  for (const auto& p : e.probes) {
    j["probes"].push_back({{"batch_size", p.batch_size},
                           {"micro_batch_size", p.micro_batch},
                           {"length", p.length},
                           {"peak_bytes", p.peak},
                           {"peak_forward_backward_bytes", p.peak_forward_backward},
                           {"peak_optimizer_step_bytes", p.peak_optimizer_step},
                           {"reserved_bytes", p.reserved},
                           {"out_of_memory", p.out_of_memory},
                           {"error", p.error},
                           {"checkpointed_blocks", p.checkpointed_blocks},
                           {"moment_bits", p.moment_bits},
                           {"offload", p.offload},
                           {"forward_backward_seconds", p.forward_backward_seconds},
                           {"optimizer_seconds", p.optimizer_seconds}});
  }
  j["eval"] = {{"batch_size", e.eval_batch},
               {"test_samples", e.test_samples},
               {"base_bytes", e.eval_base},
               {"per_sample_bytes", e.eval_per_sample},
               {"peak_bytes", e.eval_peak},
               {"max_batch_size", e.max_eval_batch()},
               {"per_sample_l1_bytes", e.eval_per_sample_l1},
               {"per_sample_l2_bytes", e.eval_per_sample_l2}};
  j["plugins"] = e.plugins;
  j["notes"] = e.notes;
  j["probe_overrides"] = e.probe_overrides;
  j["train_samples"] = e.train_samples;
  j["breakdown"] = {{"parameters", e.parameters}, {"gradients", e.gradients},  {"optimizer_state", e.optimizer_state},
                    {"resident", e.resident},     {"batches", e.batch_memory}, {"activations", e.activations}};
  j["peak_bytes"] = e.peak;
  j["reserved_bytes"] = e.reserved;
  j["run_peak_bytes"] = e.run_peak;
  j["limit_bytes"] = e.limit;
  j["limit_source"] = e.limit_source;
  j["limit_on_reserved"] = e.limit_on_reserved;
  j["margin"] = e.margin;
  j["fits"] = e.fits;
  j["max_micro_batch"] = e.max_micro_batch;
  j["max_micro_batch_at_batch_size"] = e.max_micro_at_batch;
  j["found_max_micro_batch"] = e.found_max_micro_batch;
  j["search"] = json::array();
  for (const auto& [m, ok] : e.search) j["search"].push_back({{"micro_batch_size", m}, {"ok", ok}});
  json ladder = {{"model_blocks", e.model_blocks},
                 {"checkpointed_held", e.checkpointed_held},
                 {"checkpointed_per_sample", e.checkpointed_per_sample},
                 {"moment_bits", e.moment_bits},
                 {"min_micro_batch", e.min_micro_batch},
                 {"rung_slack", e.rung_slack},
                 {"step_seconds", e.step_seconds},
                 {"micro_step_seconds", e.micro_step_seconds},
                 {"sample_seconds", e.sample_seconds},
                 {"checkpoint_sample_seconds", e.checkpoint_sample_seconds},
                 {"moment_rungs", json::array()},
                 {"rungs", json::array()},
                 {"cheapest", e.cheapest ? ladder_json(*e.cheapest) : json(nullptr)}};
  for (const auto& r : e.moment_rungs) {
    ladder["moment_rungs"].push_back({{"bits", r.bits},
                                      {"offload", r.offload},
                                      {"held_delta", r.held_delta},
                                      {"step_held_delta", r.step_held_delta},
                                      {"seconds_delta", r.seconds_delta}});
  }
  for (const auto& c : e.rungs) ladder["rungs"].push_back(ladder_json(c));
  j["ladder"] = ladder;
  out << j.dump() << "\n";
}

MemoryEstimate estimate_from_json(const std::string& text) {
  MemoryEstimate e;
  try {
    const json j = json::parse(text);
    e.device = j.at("device").get<std::string>();
    e.batch_size = j.at("batch_size");
    e.micro_batch = j.at("micro_batch_size");
    const json& f = j.at("fit");
    e.held = f.at("a"), e.per_sample = f.at("b"), e.per_batch_sample = f.at("c");
    e.step_held = f.at("a2"), e.step_per_batch_sample = f.at("c2");
    e.slack = f.at("slack0"), e.slack_per_sample = f.at("slack1"), e.fit_residual = f.at("residual");
    // The length terms (absent from an estimate written before there was a length axis: 0).
    e.per_sample_l1 = f.value("b_l1", 0.0), e.per_sample_l2 = f.value("b_l2", 0.0);
    e.per_batch_sample_l1 = f.value("c_l1", 0.0), e.step_per_batch_sample_l1 = f.value("c2_l1", 0.0);
    e.slack_l1 = f.value("slack_l1", 0.0), e.floor = f.value("floor", 0.0);
    e.length = j.value("length", std::int64_t{0});
    for (const auto& a : j.value("by_length", json::array())) {
      e.by_length.push_back({a.at("length"), a.at("peak_bytes"), a.at("max_micro_batch"),
                             a.at("max_micro_batch_at_batch_size"), a.at("eval_peak_bytes")});
    }
    for (const auto& p : j.at("probes")) {
      Probe q;
      q.batch_size = p.at("batch_size");
      q.micro_batch = p.at("micro_batch_size");
      q.length = p.value("length", std::int64_t{0});
      q.peak = p.at("peak_bytes");
      q.peak_forward_backward = p.at("peak_forward_backward_bytes");
      q.peak_optimizer_step = p.at("peak_optimizer_step_bytes");
      q.reserved = p.at("reserved_bytes");
      q.out_of_memory = p.at("out_of_memory");
      q.error = p.at("error").get<std::string>();
      q.checkpointed_blocks = p.value("checkpointed_blocks", std::int64_t{0});
      q.moment_bits = p.value("moment_bits", 0);
      q.offload = p.value("offload", false);
      q.forward_backward_seconds = p.value("forward_backward_seconds", 0.0);
      q.optimizer_seconds = p.value("optimizer_seconds", 0.0);
      e.probes.push_back(q);
    }
    const json& ev = j.at("eval");
    e.eval_batch = ev.at("batch_size");
    e.test_samples = ev.at("test_samples");
    e.eval_base = ev.at("base_bytes");
    e.eval_per_sample = ev.at("per_sample_bytes");
    e.eval_peak = ev.at("peak_bytes");
    e.eval_per_sample_l1 = ev.value("per_sample_l1_bytes", 0.0);
    e.eval_per_sample_l2 = ev.value("per_sample_l2_bytes", 0.0);
    e.plugins = j.at("plugins").get<std::vector<std::string>>();
    e.notes = j.at("notes").get<std::vector<std::string>>();
    e.probe_overrides = j.at("probe_overrides").get<std::vector<std::string>>();
    e.train_samples = j.at("train_samples");
    const json& b = j.at("breakdown");
    e.parameters = b.at("parameters"), e.gradients = b.at("gradients");
    e.optimizer_state = b.at("optimizer_state"), e.resident = b.at("resident");
    e.batch_memory = b.at("batches"), e.activations = b.at("activations");
    e.peak = j.at("peak_bytes");
    e.reserved = j.at("reserved_bytes");
    e.run_peak = j.at("run_peak_bytes");
    e.limit = j.at("limit_bytes");
    e.limit_source = j.at("limit_source").get<std::string>();
    e.limit_on_reserved = j.at("limit_on_reserved");
    e.margin = j.at("margin");
    e.fits = j.at("fits");
    e.max_micro_batch = j.at("max_micro_batch");
    e.max_micro_at_batch = j.at("max_micro_batch_at_batch_size");
    e.found_max_micro_batch = j.at("found_max_micro_batch");
    for (const auto& s : j.at("search")) e.search.emplace_back(s.at("micro_batch_size"), s.at("ok"));
    // The ladder (absent from an estimate written before it: no rungs).
    if (j.contains("ladder")) {
      const json& l = j.at("ladder");
      e.model_blocks = l.at("model_blocks");
      e.checkpointed_held = l.at("checkpointed_held");
      e.checkpointed_per_sample = l.at("checkpointed_per_sample");
      e.moment_bits = l.at("moment_bits");
      e.min_micro_batch = l.at("min_micro_batch");
      e.rung_slack = l.at("rung_slack");
      e.step_seconds = l.at("step_seconds");
      e.micro_step_seconds = l.at("micro_step_seconds");
      e.sample_seconds = l.at("sample_seconds");
      e.checkpoint_sample_seconds = l.at("checkpoint_sample_seconds");
      for (const auto& r : l.at("moment_rungs")) {
        e.moment_rungs.push_back({r.at("bits"), r.at("held_delta"), r.at("step_held_delta"), r.at("seconds_delta"),
                                  r.value("offload", false)});
      }
      for (const auto& c : l.at("rungs")) e.rungs.push_back(ladder_from_json(c));
      if (!l.at("cheapest").is_null()) e.cheapest = ladder_from_json(l.at("cheapest"));
    }
  } catch (const json::exception& x) {
    throw Error(std::string("unreadable memory estimate: ") + x.what());
  }
  return e;
}

}  // namespace trainer::tune
