// libtrainer_sentencepiece.so: libsentencepiece behind detail::SentencePieceModel, opened with
// RTLD_LOCAL by sentencepiece_loader.cpp (sentencepiece_model.h says why).
#include <sentencepiece_processor.h>

#include "text/sentencepiece_model.h"

namespace {

/// The last message of this thread, owned here.
thread_local std::string last_error;

class Model final : public trainer::text::detail::SentencePieceModel {
 public:
  sentencepiece::SentencePieceProcessor sp;

  const char* encode(std::string_view text, Emit emit, void* context) const override {
    try {
      std::vector<std::string> pieces;
      const auto status = sp.Encode(text, &pieces);
      if (!status.ok()) {
        last_error = status.ToString();
        return last_error.c_str();
      }
      for (const auto& p : pieces) emit(context, p.data(), p.size());
      return nullptr;
    } catch (const std::exception& e) {
      last_error = e.what();
      return last_error.c_str();
    }
  }
  int piece_to_id(std::string_view piece) const override { return sp.PieceToId(piece); }
  std::string_view id_to_piece(int id) const override { return sp.IdToPiece(id); }
  bool is_unknown(int id) const override { return sp.IsUnknown(id); }
  int size() const override { return sp.GetPieceSize(); }
};

}  // namespace

extern "C" __attribute__((visibility("default"))) trainer::text::detail::SentencePieceModel*
trainer_sentencepiece_load_v1(const char* bytes, std::size_t size, const char** error) {
  try {
    auto m = std::make_unique<Model>();
    const auto status = m->sp.LoadFromSerializedProto(std::string_view(bytes, size));
    if (!status.ok()) {
      last_error = status.ToString();
      *error = last_error.c_str();
      return nullptr;
    }
    return m.release();
  } catch (const std::exception& e) {
    last_error = e.what();
    *error = last_error.c_str();
    return nullptr;
  }
}
