#pragma once
// A text classification task written into a directory: a WordPiece tokenizer of a few words
// (as Hugging Face's tokenizers writes one for BERT), 1,000 short training texts and 64 test
// texts of two classes, and a recipe training text_classification.toml's encoder (2 layers of
// width 128, 4 heads, 64 positions) on them: for tests of memory over sequence lengths, which
// need the data's shape, not its words.
#include <string>

#include "support/test_util.h"

namespace trainer::testing {

// A WordPiece tokenizer of a few words, as Hugging Face's tokenizers writes one for BERT.
constexpr const char* kTinyTokenizer =
    R"({"added_tokens":[{"id":0,"content":"[PAD]","special":true,"normalized":false},)"
    R"({"id":1,"content":"[UNK]","special":true,"normalized":false},)"
    R"({"id":2,"content":"[CLS]","special":true,"normalized":false},)"
    R"({"id":3,"content":"[SEP]","special":true,"normalized":false},)"
    R"({"id":4,"content":"[MASK]","special":true,"normalized":false}],)"
    R"("normalizer":{"type":"BertNormalizer","lowercase":true},"pre_tokenizer":{"type":"BertPreTokenizer"},)"
    R"("post_processor":{"type":"BertProcessing","sep":["[SEP]",3],"cls":["[CLS]",2]},)"
    R"("model":{"type":"WordPiece","unk_token":"[UNK]","continuing_subword_prefix":"##",)"
    R"("max_input_chars_per_word":100,"vocab":{"[PAD]":0,"[UNK]":1,"[CLS]":2,"[SEP]":3,"[MASK]":4,)"
    R"("hello":5,",":6,"world":7,"!":8,"memory":9,"runs":10,"out":11,"of":12}}})";

/// Writes tokenizer.json, train.csv and test.csv into `dir`; returns the recipe's text (batches
/// of 64, dataset.max_length 64, an evaluation of 64 each epoch, adamw, one thread).
inline std::string tiny_text_recipe(const std::string& dir) {
  write_file(dir + "/tokenizer.json", kTinyTokenizer);
  std::string train = "text,label\n", test = "text,label\n";
  for (int i = 0; i < 1000; ++i) train += i % 2 ? "hello world!,a\n" : "memory runs out of memory,b\n";
  for (int i = 0; i < 64; ++i) test += i % 2 ? "hello world,a\n" : "runs out,b\n";
  write_file(dir + "/train.csv", train);
  write_file(dir + "/test.csv", test);
  return "[run]\nname = \"lengths\"\nseed = 1\n"
         "[model]\nname = \"bert\"\nhidden_size = 128\nnum_hidden_layers = 2\nnum_attention_heads = 4\n"
         "intermediate_size = 512\nmax_position_embeddings = 64\n"
         "[dataset]\nname = \"text\"\ntrain = \"" +
         dir + "/train.csv\"\ntest = \"" + dir + "/test.csv\"\ntokenizer = \"" + dir +
         "/tokenizer.json\"\nmax_length = 64\n"
         "[training]\nepochs = 1\nbatch_size = 64\n[optim]\nname = \"adamw\"\nlr = 0.001\n"
         "[eval]\nevery_epochs = 1\nbatch_size = 64\n[runtime]\nnum_threads = 1\n";
}

}  // namespace trainer::testing
