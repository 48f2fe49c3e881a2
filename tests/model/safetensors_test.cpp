// model.weights from safetensors files: what Hugging Face's safetensors library writes
// (tests/model/safetensors_files.py, in the venv of tests/hf/hf_venv.sh) loads as the same
// state_dict saved by torch.save does, converted to the model's dtype on the way without a
// whole copy of the file in memory; hostile and damaged files, crafted byte by byte here, are
// refused with exit-2 errors naming the file and what is wrong.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>

#include "support/test_util.h"
#include "trainer/error.h"
#include "trainer/memory.h"
#include "trainer/model.h"

namespace trainer {
namespace {

using testing::write_file;

const std::string kDir = TRAINER_SAFETENSORS_FIXTURES;
const c10::Device kCpu(c10::kCPU);

using Tensors = std::map<std::string, at::Tensor>;

std::shared_ptr<Model> resnet18(const std::string& dtype = "float32") {
  torch::manual_seed(3);
  return build_model(Config::parse("name = \"resnet\"\ndepth = 18\ndtype = \"" + dtype + "\"\n"),
                     DataSpec{{3, 32, 32}, 10});
}

Tensors state_of(Model& m) {
  Tensors out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value().detach().clone();
  return out;
}

/// The UsageError message of loading `file` into `m`, "" when it loads.
std::string refusal(Model& m, const std::string& file) {
  try {
    load_weights(m, file);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// The same state_dict written by torch.save and by safetensors loads into the same tensors,
// bit for bit (both float32: nothing to convert).
TEST(SafeTensors, LoadsAsTheSameStateDictFromTorchSave) {
  auto a = resnet18();
  const WeightsReport from_pt = load_weights(*a, kDir + "/resnet18.pt");
  auto b = resnet18();
  const WeightsReport from_st = load_weights(*b, kDir + "/resnet18.safetensors");
  EXPECT_EQ(from_st.format, "safetensors");
  EXPECT_EQ(from_st.loaded, from_pt.loaded);
  EXPECT_EQ(from_st.loaded, 122);  // 62 parameters, 60 BatchNorm buffers (20 of them int64 counters)
  const Tensors want = state_of(*a), got = state_of(*b);
  for (const auto& [name, t] : want) EXPECT_TRUE(torch::equal(got.at(name), t)) << name;
}

// Files of bfloat16, float16 and float64 tensors load into a float32 model as their values
// widened or rounded by a copy would: exactly the file's values (float32 holds bf16 and fp16
// exactly), or float64 rounded to the nearest float32.
TEST(SafeTensors, ConvertsEachFloatingDtypeToTheModels) {
  auto ref = resnet18();
  load_weights(*ref, kDir + "/resnet18.pt");
  const Tensors want = state_of(*ref);
  for (const auto& [suffix, dtype] :
       {std::pair{"bf16", at::kBFloat16}, std::pair{"f16", at::kHalf}, std::pair{"f64", at::kDouble}}) {
    SCOPED_TRACE(suffix);
    auto m = resnet18();
    load_weights(*m, kDir + "/resnet18_" + suffix + ".safetensors");
    for (const auto& [name, t] : state_of(*m)) {
      const at::Tensor expected =
          want.at(name).is_floating_point() ? want.at(name).to(dtype).to(at::kFloat) : want.at(name);
      EXPECT_TRUE(torch::equal(t, expected)) << name;
    }
  }
}

// Into a bfloat16 model from a float32 file: each tensor is read a chunk (1 MiB) at a time and
// converted into the model's own, so the load adds at most that chunk to the model's bytes
// (a reader that made the file's float32 tensors first would add twice the model).
TEST(SafeTensors, ReadsIntoTheModelsDtypeWithoutAWholeCopy) {
  install_cpu_tracking_allocator();
  auto m = resnet18("bfloat16");
  std::int64_t bytes = 0;
  for (const auto& p : m->parameters()) bytes += p.nbytes();
  for (const auto& b : m->buffers()) bytes += b.nbytes();
  MemoryMonitor load(kCpu);
  load_weights(*m, kDir + "/resnet18.safetensors");
  EXPECT_LE(load.peak_delta(), (1 << 20) + 4096);
  EXPECT_LE(double(load.peak_delta()), 0.05 * double(bytes));
  auto ref = resnet18();
  load_weights(*ref, kDir + "/resnet18.pt");
  const Tensors want = state_of(*ref);
  for (const auto& [name, t] : state_of(*m)) {
    EXPECT_EQ(t.scalar_type(), want.at(name).is_floating_point() ? at::kBFloat16 : at::kLong) << name;
    EXPECT_TRUE(torch::equal(t, want.at(name).to(t.scalar_type()))) << name;
  }
}

/// An MLP of 3 features, one hidden layer of 4, 2 classes: body.0.weight [4, 3], body.0.bias [4],
/// body.2.weight [2, 4], body.2.bias [2].
std::shared_ptr<Model> small_mlp() {
  return build_model(Config::parse("name = \"mlp\"\nhidden = [4]\n"), DataSpec{{3}, 2});
}

/// A safetensors file: the 8-byte little-endian length of `header`, `header`, `data`.
std::string safetensors(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

/// The small MLP's four float32 tensors, each filled with its index + 1, in a file's header and
/// data, with `extra` added to the header's object.
std::pair<std::string, std::string> mlp_file(const std::string& extra = "") {
  std::string header = "{";
  std::string data;
  std::int64_t at = 0;
  int index = 0;
  for (const auto& [name, shape, n] : {std::tuple{"body.0.weight", "[4,3]", 12}, std::tuple{"body.0.bias", "[4]", 4},
                                       std::tuple{"body.2.weight", "[2,4]", 8}, std::tuple{"body.2.bias", "[2]", 2}}) {
    ++index;
    header +=
        fmt::format("\"{}\":{{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[{},{}]}},", name, shape, at, at + 4 * n);
    at += 4 * n;
    for (int i = 0; i < n; ++i) {
      const float v = static_cast<float>(index);
      data.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  header += extra.empty() ? "\"__metadata__\":{\"format\":\"pt\"}}" : extra + "}";
  return {header, data};
}

TEST(SafeTensors, AHandWrittenFileLoadsWithPaddingAndMetadata) {
  auto [header, data] = mlp_file();
  header += "        ";  // the format pads the header with spaces to an 8-byte boundary
  const std::string file = ::testing::TempDir() + "/mlp.safetensors";
  write_file(file, safetensors(header, data));
  auto m = small_mlp();
  EXPECT_EQ(load_weights(*m, file).loaded, 4);
  const Tensors s = state_of(*m);
  EXPECT_TRUE(torch::equal(s.at("body.0.weight"), torch::full({4, 3}, 1.0f)));
  EXPECT_TRUE(torch::equal(s.at("body.2.bias"), torch::full({2}, 4.0f)));
  // Told apart by its content, whatever its name.
  const std::string renamed = ::testing::TempDir() + "/mlp_weights.bin";
  write_file(renamed, safetensors(header, data));
  auto again = small_mlp();
  EXPECT_EQ(load_weights(*again, renamed).format, "safetensors");
}

struct Hostile {
  std::string name;
  std::string bytes;
  std::string says;
};

std::vector<Hostile> hostile_files() {
  const auto [header, data] = mlp_file();
  std::vector<Hostile> out;
  std::string beyond = safetensors(header, data);
  beyond[5] = '\x01';  // a length of 2^40
  out.push_back({"header_beyond_the_file", beyond, "its header would be 1099511628"});
  out.push_back({"not_json", safetensors("{\"body.0.bias\":", data), "its header is not JSON"});
  out.push_back({"deep", safetensors(std::string(50, '[') + std::string(50, ']'), ""), "nests deeper"});
  out.push_back({"an_array", safetensors("[1, 2]", ""), "its header is a JSON array, not an object"});
  std::string h = header;
  out.push_back({"fp8", safetensors(h.replace(h.find("F32"), 3, "F8_E4M3"), data),
                 "tensor 'body.0.weight' has dtype 'F8_E4M3'; trainer reads F64, F32, F16, BF16, I64"});
  h = header;
  out.push_back({"negative", safetensors(h.replace(h.find("[4]"), 3, "[-4]"), data),
                 "tensor 'body.0.bias': a dimension is -4, not a non-negative integer"});
  h = header;
  out.push_back({"wrong_size", safetensors(h.replace(h.find("[4,3]"), 5, "[4,2]"), data),
                 "tensor 'body.0.weight': data_offsets [0, 48] hold 48 bytes; its dtype F32 and shape [4,2] take 32"});
  h = header;
  out.push_back({"huge", safetensors(h.replace(h.find("[4,3]"), 5, "[4611686018427387904,4]"), data),
                 "more elements than any file"});
  out.push_back({"trailing_bytes", safetensors(header, data + "0123"),
                 "its tensors take 104 bytes after the header; the file has 108 there"});
  out.push_back({"short", safetensors(header, data.substr(0, 100)),
                 "tensor 'body.2.bias': data_offsets [96, 104] reach past the file's 100 bytes of data"});
  h = header;
  out.push_back({"past_the_end",
                 safetensors(h.replace(h.find("[96,104]"), 8, "[9223372036854775800,9223372036854775807]"), data),
                 "reach past the file's 104 bytes of data"});
  // The tensors are at [0,48], [48,64], [64,96], [96,104]: body.0.bias moved 8 bytes on leaves
  // 48-56 to none, body.2.bias moved 8 bytes back shares 88-96 with body.2.weight.
  h = header;
  out.push_back(
      {"gap", safetensors(h.replace(h.find("[48,64]"), 7, "[56,72]"), data), "its tensors' bytes leave a gap at 48"});
  h = header;
  out.push_back(
      {"overlap", safetensors(h.replace(h.find("[96,104]"), 8, "[88,96]"), data), "its tensors' bytes overlap at 88"});
  const auto twice = mlp_file("\"body.0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[104,120]}");
  out.push_back({"twice", safetensors(twice.first, twice.second + std::string(16, '\0')),
                 "its header names 'body.0.bias' twice"});
  h = header;
  out.push_back({"extra_key", safetensors(h.replace(h.find("\"dtype\""), 0, "\"extra\":1,"), data),
                 "has the key 'extra'; an entry has dtype, shape and data_offsets only"});
  return out;
}

TEST(SafeTensors, HostileAndDamagedFilesAreRefusedNamingTheProblem) {
  for (const Hostile& c : hostile_files()) {
    SCOPED_TRACE(c.name);
    const std::string file = ::testing::TempDir() + "/" + c.name + ".safetensors";
    write_file(file, c.bytes);
    auto m = small_mlp();
    const Tensors before = state_of(*m);
    const std::string message = refusal(*m, file);
    EXPECT_NE(message.find("model.weights = \"" + file + "\": a damaged safetensors file: "), std::string::npos)
        << message;
    EXPECT_NE(message.find(c.says), std::string::npos) << message;
    for (const auto& [name, t] : state_of(*m)) EXPECT_TRUE(torch::equal(t, before.at(name))) << name;  // untouched
  }
}

// A well-formed file that does not fit the model: the checks of every weights file, with the
// file's dtype and shape read from its header.
TEST(SafeTensors, AFileThatDoesNotFitTheModelNamesTheTensor) {
  auto [header, data] = mlp_file();
  std::string h = header;
  h.replace(h.find("\"F32\",\"shape\":[4]"), 5, "\"I32\"");  // body.0.bias as int32, same bytes
  const std::string file = ::testing::TempDir() + "/int_bias.safetensors";
  write_file(file, safetensors(h, data));
  auto m = small_mlp();
  const std::string message = refusal(*m, file);
  EXPECT_NE(message.find("(safetensors) does not fit the model: 1 mis-shaped or mis-typed, the first body.0.bias "
                         "(file Int, model Float)"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace trainer
