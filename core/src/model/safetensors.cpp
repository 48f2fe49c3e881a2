#include "model/safetensors.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "trainer/json.h"
#include "util/durable_file.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian, as this reader's host");

namespace trainer::detail {

namespace {

using Json = nlohmann::json;

struct DtypeName {
  const char* name;
  c10::ScalarType type;
};

/// The dtypes read (the safetensors names), in the order messages list them.
constexpr DtypeName kDtypes[] = {
    {"F64", c10::ScalarType::Double},    {"F32", c10::ScalarType::Float}, {"F16", c10::ScalarType::Half},
    {"BF16", c10::ScalarType::BFloat16}, {"I64", c10::ScalarType::Long},  {"I32", c10::ScalarType::Int},
    {"I16", c10::ScalarType::Short},     {"I8", c10::ScalarType::Char},   {"U8", c10::ScalarType::Byte},
    {"BOOL", c10::ScalarType::Bool},
};

std::string known_dtypes() {
  std::vector<std::string> names;
  for (const auto& d : kDtypes) names.emplace_back(d.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

/// Reads exactly `n` bytes at `offset`; false when the file ends first.
bool read_at(int fd, void* into, std::int64_t n, std::int64_t offset) {
  auto* p = static_cast<char*>(into);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, static_cast<std::size_t>(n), offset);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw SafeTensorsError(fmt::format("reading failed: {}", std::strerror(errno)));
    if (got == 0) return false;
    p += got;
    n -= got;
    offset += got;
  }
  return true;
}

std::uint64_t little_endian_u64(const unsigned char* b) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

/// A non-negative integer of the header (a dimension or an offset), within int64.
std::int64_t count_of(const Json& v, const std::string& what) {
  if (!v.is_number_unsigned()) {  // nlohmann's type for a literal without sign, fraction or exponent
    throw SafeTensorsError(fmt::format("{} is {}, not a non-negative integer", what, v.dump()));
  }
  const auto u = v.get<std::uint64_t>();
  if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    throw SafeTensorsError(fmt::format("{} is {}, beyond any file", what, u));
  }
  return static_cast<std::int64_t>(u);
}

/// Dimensions of one tensor: as the torch.save reader allows (no model has more than a handful).
constexpr std::size_t kMaxDims = 64;

/// A name as messages show it: at most 200 bytes of it.
std::string shown(const std::string& name) { return name.size() <= 200 ? name : name.substr(0, 200) + "..."; }

/// `data_bytes`: what the file holds after its header; each range must lie within it.
SafeTensorInfo parse_entry(const std::string& name, const Json& v, std::int64_t data_bytes) {
  const std::string where = fmt::format("tensor '{}'", shown(name));
  if (!v.is_object()) throw SafeTensorsError(fmt::format("{} is {}, not an object", where, v.type_name()));
  for (const auto& [key, _] : v.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      throw SafeTensorsError(
          fmt::format("{} has the key '{}'; an entry has dtype, shape and data_offsets only", where, key));
    }
  }
  if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
    throw SafeTensorsError(fmt::format("{} lacks dtype, shape or data_offsets", where));
  }
  SafeTensorInfo info;
  const Json& dtype = v["dtype"];
  if (!dtype.is_string()) throw SafeTensorsError(fmt::format("{}: dtype is {}, not a string", where, dtype.dump()));
  info.dtype_name = dtype.get<std::string>();
  const auto known = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                  [&](const DtypeName& d) { return info.dtype_name == d.name; });
  if (known == std::end(kDtypes)) {
    throw SafeTensorsError(
        fmt::format("{} has dtype '{}'; trainer reads {}", where, info.dtype_name.substr(0, 32), known_dtypes()));
  }
  info.dtype = known->type;
  const Json& shape = v["shape"];
  if (!shape.is_array()) throw SafeTensorsError(fmt::format("{}: shape is {}, not a list", where, shape.type_name()));
  if (shape.size() > kMaxDims) {
    throw SafeTensorsError(fmt::format("{} has {} dimensions; at most {} are read", where, shape.size(), kMaxDims));
  }
  std::int64_t numel = 1;
  for (const Json& d : shape) {
    const std::int64_t n = count_of(d, where + ": a dimension");
    info.shape.push_back(n);
    if (__builtin_mul_overflow(numel, n, &numel)) {
      throw SafeTensorsError(fmt::format("{} has the shape {}: more elements than any file", where, shape.dump()));
    }
  }
  if (__builtin_mul_overflow(numel, static_cast<std::int64_t>(c10::elementSize(info.dtype)), &info.bytes)) {
    throw SafeTensorsError(fmt::format("{} has the shape {}: more bytes than any file", where, shape.dump()));
  }
  const Json& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    throw SafeTensorsError(fmt::format("{}: data_offsets is {}, not [begin, end]", where, offsets.dump()));
  }
  const std::int64_t begin = count_of(offsets[0], where + ": data_offsets' begin");
  const std::int64_t end = count_of(offsets[1], where + ": data_offsets' end");
  if (end > data_bytes) {
    throw SafeTensorsError(
        fmt::format("{}: data_offsets [{}, {}] reach past the file's {} bytes of data", where, begin, end, data_bytes));
  }
  if (end < begin || end - begin != info.bytes) {
    throw SafeTensorsError(fmt::format("{}: data_offsets [{}, {}] hold {} bytes; its dtype {} and shape {} take {}",
                                       where, begin, end, end - begin, info.dtype_name, shape.dump(), info.bytes));
  }
  info.offset = begin;  // relative to the data until the header's size is added
  return info;
}

}  // namespace

SafeTensorsFile::SafeTensorsFile(const std::string& path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw SafeTensorsError(fmt::format("cannot open it: {}", std::strerror(errno)));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) throw SafeTensorsError("not a regular file");
    size_ = static_cast<std::int64_t>(st.st_size);
    unsigned char head[8];
    if (size_ < 8 || !read_at(fd_, head, 8, 0)) {
      throw SafeTensorsError(fmt::format("{} bytes: shorter than a safetensors header's length", size_));
    }
    const std::uint64_t n = little_endian_u64(head);
    if (n > static_cast<std::uint64_t>(kMaxHeaderBytes) || static_cast<std::int64_t>(n) > size_ - 8) {
      throw SafeTensorsError(fmt::format("its header would be {} bytes, in a file of {} (at most {} are read)", n,
                                         size_, kMaxHeaderBytes));
    }
    std::string header(static_cast<std::size_t>(n), '\0');
    if (!read_at(fd_, header.data(), static_cast<std::int64_t>(n), 8)) throw SafeTensorsError("the file ended early");
    // Root object, an entry's object, its lists: three levels. Checked before parsing, so that
    // no nesting reaches the parser or the destructor of what it builds.
    if (json_nesting(header) > 3) throw SafeTensorsError("its header nests deeper than a safetensors header does");
    // A name given twice would be one tensor to this reader and another to one keeping the first.
    std::set<std::string> names;
    std::string twice;
    const Json root = Json::parse(
        header,
        [&](int depth, Json::parse_event_t event, Json& parsed) {
          if (event == Json::parse_event_t::key && depth == 1 && !names.insert(parsed.get<std::string>()).second) {
            twice = parsed.get<std::string>();
          }
          return true;
        },
        /*allow_exceptions=*/false);
    if (root.is_discarded()) throw SafeTensorsError("its header is not JSON");
    if (!twice.empty()) throw SafeTensorsError(fmt::format("its header names '{}' twice", shown(twice)));
    if (!root.is_object())
      throw SafeTensorsError(fmt::format("its header is a JSON {}, not an object", root.type_name()));
    const std::int64_t data_start = 8 + static_cast<std::int64_t>(n);
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;  // (begin, end) in the data
    for (const auto& [name, v] : root.items()) {
      if (name == "__metadata__") {
        if (!v.is_object()) throw SafeTensorsError("__metadata__ is not an object");
        for (const auto& [k, s] : v.items()) {
          if (!s.is_string()) throw SafeTensorsError(fmt::format("__metadata__ '{}' is not a string", k));
          metadata_[k] = s.get<std::string>();
        }
        continue;
      }
      if (name.empty()) throw SafeTensorsError("a tensor has an empty name");
      SafeTensorInfo info = parse_entry(name, v, size_ - data_start);
      ranges.emplace_back(info.offset, info.offset + info.bytes);
      info.offset += data_start;
      tensors_.emplace(name, std::move(info));
    }
    // The ranges tile the data: each starts where the one before ends, from 0 to its end.
    std::sort(ranges.begin(), ranges.end());
    std::int64_t at = 0;
    for (const auto& [begin, end] : ranges) {
      if (begin != at) {
        throw SafeTensorsError(
            fmt::format("its tensors' bytes {} at {} (each range must start where the one "
                        "before ends, without gap or overlap)",
                        begin < at ? "overlap" : "leave a gap", std::min(begin, at)));
      }
      at = end;
    }
    if (at != size_ - data_start) {
      throw SafeTensorsError(
          fmt::format("its tensors take {} bytes after the header; the file has {} there", at, size_ - data_start));
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafeTensorsFile::~SafeTensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool SafeTensorsFile::sniff(const std::string& path) {
  const std::string suffix = ".safetensors";
  if (path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return true;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  unsigned char head[8];
  struct stat st {};
  bool ok = false;
  try {
    // A zip's "PK\3\4", a pickle's protocol bytes or text read as a length are beyond any file.
    ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 10 && read_at(fd, head, 8, 0) &&
         little_endian_u64(head) >= 2 &&
         little_endian_u64(head) <= static_cast<std::uint64_t>(std::min<std::int64_t>(st.st_size - 8, kMaxHeaderBytes));
  } catch (const SafeTensorsError&) {
    ok = false;
  }
  ::close(fd);
  return ok;
}

void SafeTensorsFile::read_into(const std::string& name, at::Tensor& dst) const {
  const auto it = tensors_.find(name);
  TRAINER_CHECK(it != tensors_.end(), "no tensor '", name, "' in the safetensors file");
  const SafeTensorInfo& info = it->second;
  TRAINER_CHECK(dst.sizes() == at::IntArrayRef(info.shape) && dst.is_contiguous(), "tensor '", name, "' of shape ",
                fmt::format("{}", fmt::join(info.shape, ", ")), " read into one of shape ", dst.sizes());
  const bool bool_file = info.dtype == at::kBool;
  if (dst.is_floating_point() != at::isFloatingType(info.dtype) || (dst.scalar_type() == at::kBool) != bool_file) {
    throw SafeTensorsError(fmt::format("tensor '{}' is {} in the file; the model's is {}", shown(name), info.dtype_name,
                                       c10::toString(dst.scalar_type())));
  }
  if (info.bytes == 0) return;
  const std::int64_t item = static_cast<std::int64_t>(c10::elementSize(info.dtype));
  const std::int64_t chunk = std::min(kChunkBytes / item * item, info.bytes);
  at::Tensor buffer = at::empty({chunk}, at::kByte);
  at::Tensor flat = dst.view({-1});
  at::NoGradGuard no_grad;
  for (std::int64_t done = 0; done < info.bytes; done += chunk) {
    const std::int64_t n = std::min(chunk, info.bytes - done);
    if (!read_at(fd_, buffer.data_ptr(), n, info.offset + done)) {
      throw SafeTensorsError(fmt::format("the file ended inside tensor '{}': it changed after it was opened", name));
    }
    at::Tensor bytes = buffer.narrow(0, 0, n);
    if (bool_file && bytes.gt(1).any().item<bool>()) {
      throw SafeTensorsError(fmt::format("tensor '{}' (BOOL) holds a byte other than 0 and 1", name));
    }
    flat.narrow(0, done / item, n / item).copy_(bytes.view(info.dtype));
  }
}

at::Tensor SafeTensorsFile::read(const std::string& name) const {
  const auto it = tensors_.find(name);
  TRAINER_CHECK(it != tensors_.end(), "no tensor '", name, "' in the safetensors file");
  at::Tensor t = at::empty(it->second.shape, at::TensorOptions(it->second.dtype));
  read_into(name, t);
  return t;
}

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::int64_t at = 0;
  for (const auto& [name, t] : tensors) {
    const c10::ScalarType type = t.scalar_type();
    const auto known =
        std::find_if(std::begin(kDtypes), std::end(kDtypes), [type](const DtypeName& d) { return d.type == type; });
    TRAINER_CHECK(known != std::end(kDtypes), "writing ", path, ": tensor '", name, "' is ",
                  c10::toString(t.scalar_type()), ", which safetensors files do not hold here");
    const std::int64_t bytes = t.numel() * static_cast<std::int64_t>(t.element_size());
    header[name] = {{"dtype", known->name}, {"shape", t.sizes().vec()}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  write_atomic(path, [&](std::ostream& out) {
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xff);
    out.write(reinterpret_cast<const char*>(length), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, t] : tensors) {
      const at::Tensor c = t.detach().to(at::kCPU).contiguous();
      out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
    }
  });
}

}  // namespace trainer::detail
