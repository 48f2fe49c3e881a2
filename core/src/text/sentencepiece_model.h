#pragma once
// A SentencePiece model as libsentencepiece encodes with it, behind an interface that does not
// name the library. Debian's libsentencepiece carries its own copy of protobuf and exports its
// symbols: linked into a process that also has libprotobuf (LibTorch's), the protobuf of one
// binds to the other's functions and crashes before main. So the library is loaded only by
// the module libtrainer_sentencepiece.so, opened on first use with RTLD_LOCAL (its symbols
// never enter the process's global scope) and RTLD_DEEPBIND (the library binds to its own
// protobuf, not to the process's). Nothing the module allocates is freed out of it: text
// leaves it as views and through a callback. Internal to text/.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace trainer::text::detail {

class SentencePieceModel {
 public:
  virtual ~SentencePieceModel() = default;
  using Emit = void (*)(void* context, const char* piece, std::size_t size);
  /// Calls `emit` with each piece of `text`: nullptr when done, else the library's message
  /// (valid until this thread's next call).
  virtual const char* encode(std::string_view text, Emit emit, void* context) const = 0;
  /// The piece's id, the unknown piece's when the model has no such piece.
  virtual int piece_to_id(std::string_view piece) const = 0;
  virtual std::string_view id_to_piece(int id) const = 0;
  virtual bool is_unknown(int id) const = 0;
  virtual int size() const = 0;
};

/// Checks the normalization tables of a .model file's bytes, which libsentencepiece walks
/// without bounds checks: UsageError naming `name` when a walk could leave them.
void check_normalizers(const std::string& model, const std::string& name);

/// A model from the bytes of a .model file (a serialized ModelProto); UsageError naming `name`
/// when libsentencepiece refuses them, Error when the module cannot be loaded.
std::unique_ptr<SentencePieceModel> load_sentencepiece(const std::string& bytes, const std::string& name);

}  // namespace trainer::text::detail

/// The module's one entry point: a model, or nullptr with `error` set to the library's message
/// (valid until this thread's next call).
extern "C" trainer::text::detail::SentencePieceModel* trainer_sentencepiece_load_v1(const char* bytes, std::size_t size,
                                                                                    const char** error);
