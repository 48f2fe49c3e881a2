#pragma once
// The recipe of the text dataset's runs (text_dataset_test.cpp, masked_text_test.cpp): a BERT of
// 2 layers of width 32 from scratch, batches of 16, adamw, an evaluation each epoch, one thread,
// no console. The dataset and the task come as overrides.

namespace trainer::testing {

constexpr const char* kTinyBertRecipe = R"(
[run]
name = "text"
seed = 3
[model]
name = "bert"
hidden_size = 32
num_hidden_layers = 2
num_attention_heads = 2
intermediate_size = 64
max_position_embeddings = 64
[training]
epochs = 1
batch_size = 16
log_every = 1
[optim]
name = "adamw"
lr = 0.001
[eval]
every_epochs = 1
batch_size = 16
[runtime]
num_threads = 1
[metrics]
console = false
)";

}  // namespace trainer::testing
