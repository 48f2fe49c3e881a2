#include "model/tensor_archive.h"

#include <fmt/format.h>
#include <filesystem>
#include <vector>

#include "trainer/error.h"
#include "util/durable_file.h"

namespace trainer::detail {

void write_nested(torch::serialize::OutputArchive& archive, const NamedTensors& tensors) {
  std::map<std::string, NamedTensors> children;
  for (const auto& [name, t] : tensors) {
    const auto dot = name.find('.');
    if (dot == std::string::npos) {
      archive.write(name, t.detach().to(at::kCPU));
    } else {
      children[name.substr(0, dot)][name.substr(dot + 1)] = t;
    }
  }
  for (const auto& [child, inner] : children) {
    torch::serialize::OutputArchive sub(archive.compilation_unit());
    write_nested(sub, inner);
    archive.write(child, sub);
  }
}

void read_nested(torch::serialize::InputArchive& archive, const std::string& prefix, NamedTensors& out) {
  for (const auto& key : archive.keys()) {
    at::Tensor t;
    if (archive.try_read(key, t)) {
      out[prefix + key] = t;
      continue;
    }
    torch::serialize::InputArchive sub;
    if (archive.try_read(key, sub)) read_nested(sub, prefix + key + ".", out);
  }
}

void save_archive(torch::serialize::OutputArchive& archive, const std::string& path) {
  // Through the temporary write_atomic creates (never a file or link found at its name).
  try {
    write_atomic(path, [&archive](std::ostream& out) { archive.save_to(out); });
  } catch (const c10::Error& e) {
    throw Error(fmt::format("cannot write {}: {}", path, e.what_without_backtrace()));
  }
}

}  // namespace trainer::detail
