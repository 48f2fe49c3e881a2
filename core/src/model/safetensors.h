#pragma once
// Private: reads Hugging Face's safetensors files (what save_pretrained writes as
// model.safetensors): an 8-byte little-endian header length N, N bytes of JSON naming each
// tensor's dtype, shape and byte range, then the raw data, C order, little-endian.
//
// Weight files come from anywhere: the header is at most kMaxHeaderBytes and the file's size,
// its JSON is checked for nesting before it is parsed, and the byte ranges must tile the data
// exactly (no gap, no overlap, each range the size its dtype and shape say), so reading the
// tensors allocates nothing the file's size does not bound. Tensors are read with pread in
// chunks of at most kChunkBytes into the destination, converted to its dtype and moved to its
// device on the way: loading a model this way takes its own bytes plus one chunk.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainer/error.h"

namespace trainer::detail {

/// The largest header read: the safetensors library's own limit (100 MB; a header names each
/// tensor in ~100 bytes, so a million tensors).
inline constexpr std::int64_t kMaxHeaderBytes = 100'000'000;

/// Bytes read from the file at a time into the destination.
inline constexpr std::int64_t kChunkBytes = 1 << 20;

/// A file that is not a well-formed safetensors file, or one that changed while it was read.
class SafeTensorsError : public Error {
 public:
  using Error::Error;
};

/// One tensor of a safetensors file.
struct SafeTensorInfo {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::string dtype_name;  ///< the file's: "F32", "BF16", ...
  std::vector<std::int64_t> shape;
  std::int64_t offset = 0;  ///< of its first byte in the file
  std::int64_t bytes = 0;
};

class SafeTensorsFile {
 public:
  /// Opens `path` and checks its header. Throws SafeTensorsError saying what is wrong (the
  /// caller names the file and the key that named it).
  explicit SafeTensorsFile(const std::string& path);
  ~SafeTensorsFile();
  SafeTensorsFile(const SafeTensorsFile&) = delete;
  SafeTensorsFile& operator=(const SafeTensorsFile&) = delete;

  /// Whether `path` is meant as a safetensors file: its name ends in ".safetensors", or its
  /// first 8 bytes are a header length that fits the file (a zip's, a pickle's or a text's are
  /// far beyond). Reads 8 bytes; false for anything else unreadable.
  static bool sniff(const std::string& path);

  const std::map<std::string, SafeTensorInfo>& tensors() const { return tensors_; }
  /// The header's "__metadata__" (string to string; empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// Reads tensor `name` into `dst`, which must have its shape and be contiguous; any dtype a
  /// copy converts to (a floating tensor into a floating one, an integer into an integer) and
  /// any device. Throws SafeTensorsError when the file is shorter than when it was opened.
  void read_into(const std::string& name, at::Tensor& dst) const;
  /// Tensor `name` as a new CPU tensor of the file's dtype.
  at::Tensor read(const std::string& name) const;

 private:
  int fd_ = -1;
  std::int64_t size_ = 0;
  std::map<std::string, SafeTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// Writes `tensors` (any device; made contiguous on the CPU one at a time) to `path` as a
/// safetensors file that the safetensors library and transformers' from_pretrained read:
/// entries sorted by name, data in that order, the header padded with spaces to 8 bytes.
/// Durable (a temporary file, fsync, rename). Throws trainer::Error naming the file.
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace trainer::detail
