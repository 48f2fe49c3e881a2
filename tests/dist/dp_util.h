#pragma once
// Helpers of the data-parallel tests: the model in a checkpoint, ports, and ranks started by
// hand with torchrun's variables (as a cluster's launcher would), one command line each.
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "support/test_util.h"

namespace trainer::testing {

/// The tensors of an archive and of the archives in it, by their dotted names.
inline void tensors_of(torch::serialize::InputArchive& ar, const std::string& prefix,
                       std::map<std::string, at::Tensor>& out) {
  for (const auto& key : ar.keys()) {
    at::Tensor t;
    torch::serialize::InputArchive sub;
    if (ar.try_read(key, t)) {
      out[prefix + key] = t;
    } else if (ar.try_read(key, sub)) {
      tensors_of(sub, prefix + key + ".", out);
    }
  }
}

/// The model's parameters and buffers in a checkpoint, by name.
inline std::map<std::string, at::Tensor> parameters_of(const std::string& checkpoint) {
  torch::serialize::InputArchive ar, model;
  ar.load_from(checkpoint);
  ar.read("model", model);
  std::map<std::string, at::Tensor> out;
  tensors_of(model, "", out);
  return out;
}

/// The largest absolute difference between the models of two checkpoints.
inline double largest_difference(const std::string& a, const std::string& b) {
  const auto pa = parameters_of(a), pb = parameters_of(b);
  EXPECT_EQ(pa.size(), pb.size());
  EXPECT_FALSE(pa.empty());
  double d = 0;
  for (const auto& [name, t] : pa) d = std::max(d, (pb.at(name) - t).abs().max().item<double>());
  return d;
}

/// Two runs of the same samples in the same global batches (run directories `a` and `b`) whose
/// ranks or micro-batches split them differently: the same `steps` steps logged, each train/loss
/// within 1e-4 (relative). The split changes the kernels' sizes and so the order of their sums
/// (by ~1e-7 relative in float32); 1e-4 leaves room for that to grow over a few AdamW steps, while
/// one sample of 64 lost or counted twice moves a batch's loss by about 1e-2.
inline void expect_same_losses(const std::string& a, const std::string& b, std::size_t steps) {
  const auto la = metric_by_step(a + "/metrics.jsonl", "train/loss");
  const auto lb = metric_by_step(b + "/metrics.jsonl", "train/loss");
  ASSERT_EQ(la.size(), steps) << a;
  ASSERT_EQ(lb.size(), la.size()) << b;
  for (const auto& [step, v] : la) EXPECT_NEAR(lb.at(step), v, 1e-4 * std::fabs(v)) << b << " at step " << step;
}

/// A run of one process and a run of several ranks over the same samples in the same global
/// batches (run directories `a` and `b`), where the one process's micro-batches are the ranks'
/// parts: each micro-batch's gradient is computed on the same sizes, and the one process's
/// accumulation adds the parts as the all-reduce does, so the models of `checkpoint` are the
/// same bit for bit. The logged losses are summed in float by one process and in double across
/// ranks: the same `steps` steps, each within 1e-4 (relative).
inline void expect_same_training(const std::string& a, const std::string& b, std::size_t steps,
                                 const std::string& checkpoint) {
  expect_same_losses(a, b, steps);
  EXPECT_EQ(largest_difference(a + "/" + checkpoint, b + "/" + checkpoint), 0.0) << b;
}

/// The environment torchrun gives rank `rank` of `world` on this host, as a command prefix.
inline std::string rank_env(int rank, int world, int port) {
  return "RANK=" + std::to_string(rank) + " LOCAL_RANK=" + std::to_string(rank) +
         " WORLD_SIZE=" + std::to_string(world) + " LOCAL_WORLD_SIZE=" + std::to_string(world) +
         " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " ";
}

/// The exit code of `child` once it ends, or nullopt if it is still running after `limit` (a
/// bound so that a hang fails the test instead of hanging it).
inline std::optional<int> exit_code_within(Child& child, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    const pid_t r = ::waitpid(child.pid(), &status, WNOHANG);
    if (r == child.pid()) {
      child.forget();
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

}  // namespace trainer::testing
