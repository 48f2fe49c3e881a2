// libFuzzer target for a SentencePiece model directory (a model directory may come from anyone):
// transformers' tokenizer_config.json and the model file beside it, read as
// Tokenizer::from_path reads them (the config first, then the model's normalization tables
// checked before libsentencepiece parses the model), then texts encoded alone, as a pair and cut
// to a few lengths. The expected outcomes are a tokenizer and its encodings, or a UsageError
// naming the file and key. Anything else (a crash, a hang, a sanitizer finding, a leak, another
// exception such as nlohmann::json's) is a finding.
//
// An input is the config's length (2 bytes, little-endian), the config, then the model's bytes.
// libsentencepiece is linked in here (this binary has no other protobuf, unlike the trainer
// process, which loads it through its module); it is not instrumented, so what the sanitizers
// see is trainer's side and any crash inside the library. The seeds
// (tests/fuzz/corpus_sentencepiece, written by sentencepiece_corpus.py) are small T5, ALBERT
// and DeBERTa-v2 models.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "text/sentencepiece_tokenizer.h"
#include "text/tokenizer.h"
#include "trainer/error.h"

namespace {

std::unique_ptr<trainer::text::detail::SentencePieceModel> load(const std::string& bytes) {
  trainer::text::detail::check_normalizers(bytes, "fuzz/spiece.model");
  const char* error = nullptr;
  std::unique_ptr<trainer::text::detail::SentencePieceModel> model(
      trainer_sentencepiece_load_v1(bytes.data(), bytes.size(), &error));
  if (!model) throw trainer::UsageError(std::string("fuzz/spiece.model: ") + (error ? error : "refused"));
  return model;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t length = std::min<std::size_t>(data[0] | (std::size_t{data[1]} << 8), size - 2);
  const std::string config(reinterpret_cast<const char*>(data) + 2, length);
  const std::string model(reinterpret_cast<const char*>(data) + 2 + length, size - 2 - length);
  try {
    const trainer::text::Tokenizer tok(trainer::text::detail::sentencepiece_from_config(
        config, "fuzz/tokenizer_config.json", "fuzz/spiece.model", [&] { return load(model); }));
    (void)tok.pad_id();
    (void)tok.mask_id();
    for (const char* text : {"Hello, World! 1,234 ``quoted'' caf\xC3\xA9 \xEF\xBC\xA6 \xE2\x91\xA0 [MASK] fox </s>",
                             " <extra_id_0>fox [CLS]\t\xE6\x9D\xB1\xE4\xBA\xAC  ", ""}) {
      // A text is cut to max_length unless max_length is the special tokens' count (transformers
      // then leaves it whole): 3 and up are above T5's 1 and ALBERT's and DeBERTa's 2 for one
      // text, 8 and up above their 2 and 3 for a pair. 1 is below a pair's: refused.
      for (const std::int64_t max_length : {0, 1, 3, 8, 64}) {
        try {
          const auto one = tok.encode(text, std::nullopt, max_length);
          if (one.ids.size() != one.type_ids.size() || one.ids.size() != one.special_mask.size()) __builtin_trap();
          if (max_length > 2 && static_cast<std::int64_t>(one.ids.size()) > max_length) __builtin_trap();
          const auto two = tok.encode(text, "a second text, 5,6", max_length);
          if (max_length > 3 && static_cast<std::int64_t>(two.ids.size()) > max_length) __builtin_trap();
          for (const auto* e : {&one, &two}) {
            for (const auto id : e->ids) {
              if (id < 0 || id >= tok.id_limit()) __builtin_trap();
            }
          }
        } catch (const trainer::UsageError&) {
          // A length that leaves no room beside the special tokens, or a text libsentencepiece
          // cannot encode.
        }
      }
    }
  } catch (const trainer::UsageError&) {
    // A file it cannot read, named.
  }
  return 0;
}
