// libFuzzer target for tokenizer.json files (a model directory may come from anyone) and the
// text they encode: the file read (Tokenizer::from_json), then the text encoded alone, as a
// pair and cut to a few lengths. The expected outcomes are a tokenizer and its encodings, or a
// UsageError naming the key (a file it cannot read) or saying the text is not UTF-8. Anything
// else (a crash, a hang, a sanitizer finding, a leak, another exception such as
// nlohmann::json's) is a finding.
//
// An input is the file's bytes, then a byte 0x01, then the text; without 0x01 the text is
// "Hello, world! héllo 東京 <mask> [MASK]". The seeds (tests/fuzz/corpus_tokenizer) are small
// files of each model, normalizer, pre-tokenizer and post-processor the reader has.
#include <cstddef>
#include <cstdint>
#include <string>

#include "text/tokenizer.h"
#include "trainer/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const auto cut = input.find('\x01');
  const std::string file = input.substr(0, cut);
  const std::string text = cut == std::string::npos
                               ? std::string("Hello, world! h\xC3\xA9llo \xE6\x9D\xB1\xE4\xBA\xAC <mask> [MASK]")
                               : input.substr(cut + 1);
  try {
    const auto tok = trainer::text::Tokenizer::from_json(file, "fuzz/tokenizer.json");
    (void)tok.pad_id();
    (void)tok.mask_id();
    (void)tok.id_limit();
    for (const std::int64_t max_length : {0, 3, 8, 64}) {
      try {
        const auto one = tok.encode(text, std::nullopt, max_length);
        if (one.ids.size() != one.type_ids.size() || one.ids.size() != one.special_mask.size()) __builtin_trap();
        if (max_length > 0 && static_cast<std::int64_t>(one.ids.size()) > max_length) __builtin_trap();
        const auto two = tok.encode(text, std::string_view(text).substr(text.size() / 2), max_length);
        if (max_length > 0 && static_cast<std::int64_t>(two.ids.size()) > max_length) __builtin_trap();
        for (const auto id : two.ids) {
          if (id < 0 || id >= tok.id_limit()) __builtin_trap();
        }
      } catch (const trainer::UsageError&) {
        // Invalid UTF-8, or a length that leaves no room beside the special tokens.
      }
    }
  } catch (const trainer::UsageError&) {
    // A file it cannot read, named.
  }
  return 0;
}
