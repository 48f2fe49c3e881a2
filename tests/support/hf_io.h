#pragma once
// The fixtures of tests/model/hf_models.py: io.pt of a model directory (a batch, transformers'
// logits, loss and gradients), read with LibTorch's pickle reader.
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "support/test_util.h"

namespace trainer::testing {

/// `file` (an io.pt): a dict of tensors.
inline std::map<std::string, at::Tensor> hf_io(const std::string& file) {
  const std::string bytes = read_file(file);
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict()) {
    out[kv.key().toStringRef()] = kv.value().toTensor();
  }
  return out;
}

/// [N, 3, L]: the batch's ids, attention mask and token types, as a text dataset gives them.
inline at::Tensor hf_tokens(const std::map<std::string, at::Tensor>& b) {
  return at::stack({b.at("input_ids"), b.at("attention_mask"), b.at("token_type_ids")}, 1);
}

/// The largest absolute difference of two tensors of one shape (in double).
inline double max_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace trainer::testing
