// model.weights files come from the internet: a hostile or broken torch.save file must be
// refused with a message naming the file and what is wrong, never a crash, a hang or unbounded
// memory. The files here are crafted byte by byte (a small zip writer and pickle opcodes), so
// each breaks exactly one rule; a well-formed one built the same way loads (the first test).
// Loads whose memory the reader must bound run in a child process under an address-space
// limit, so that a reader that does not bound it fails the test instead of eating the machine.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <torch/torch.h>
#include <cstring>
#include <fstream>
#include <limits>

#include "support/bounded_child.h"
#include "support/test_util.h"
#include "support/zip_writer.h"
#include "trainer/error.h"
#include "trainer/model.h"

namespace trainer {
namespace {

// ---- Pickle opcodes, protocol 2 as torch.save writes them --------------------------------

using testing::le;
using testing::zip_archive;
using testing::ZipEntry;

std::string unicode(const std::string& s) { return "X" + le(s.size(), 4) + s; }
std::string global(const std::string& module, const std::string& name) { return "c" + module + "\n" + name + "\n"; }
/// BININT, or LONG1 of 8 bytes past 32 bits.
std::string integer(std::int64_t v) {
  if (v >= std::numeric_limits<std::int32_t>::min() && v <= std::numeric_limits<std::int32_t>::max()) {
    return "J" + le(static_cast<std::uint64_t>(v), 4);
  }
  return "\x8a\x08" + le(static_cast<std::uint64_t>(v), 8);
}
std::string tuple(const std::vector<std::int64_t>& v) {
  std::string s = "(";
  for (auto x : v) s += integer(x);
  return s + "t";
}
const std::string kProto = "\x80\x02";
const std::string kEmptyOrderedDict = global("collections", "OrderedDict") + ")R";

/// _rebuild_tensor_v2 of storage data/<key>, declared `numel` floats, viewed with `size` and
/// `stride` from `offset`.
std::string tensor(const std::string& key, std::int64_t numel, const std::vector<std::int64_t>& size,
                   const std::vector<std::int64_t>& stride, std::int64_t offset = 0) {
  const std::string pid =
      "(" + unicode("storage") + global("torch", "FloatStorage") + unicode(key) + unicode("cpu") + integer(numel) + "t";
  return global("torch._utils", "_rebuild_tensor_v2") + "(" + pid + "Q" + integer(offset) + tuple(size) +
         tuple(stride) + "\x89" + kEmptyOrderedDict + "tR";
}

/// An OrderedDict of name -> pickled value, as torch.save(model.state_dict()) writes it.
std::string state_dict(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string s = kProto + kEmptyOrderedDict + "(";
  for (const auto& [k, v] : items) s += unicode(k) + v;
  return s + "u.";
}

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * sizeof(float), '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

/// torch.save's records around a data.pkl: its storages data/0 ([1.5, -2]) and data/1
/// ([0.25, 4]), and the version record LibTorch's reader requires.
std::vector<ZipEntry> records(const std::string& pickle) {
  return {{"data.pkl", pickle, false, std::nullopt, -1},
          {"data/0", floats({1.5f, -2.f}), false, std::nullopt, -1},
          {"data/1", floats({0.25f, 4.f}), false, std::nullopt, -1},
          {"version", "3\n", false, std::nullopt, -1}};
}

/// {"w": data/0, "v": data/1}: the state_dict of TwoVectors.
std::string good_pickle() { return state_dict({{"w", tensor("0", 2, {2}, {1})}, {"v", tensor("1", 2, {2}, {1})}}); }

/// A model of two parameters, w and v, of two elements each.
class TwoVectors : public Model {
 public:
  TwoVectors() {
    w = register_parameter("w", torch::zeros({2}));
    v = register_parameter("v", torch::zeros({2}));
  }
  at::Tensor forward(const at::Tensor& x) override { return x * w + v; }
  at::Tensor w, v;
};

class TorchSaveBounds : public ::testing::Test {
 protected:
  /// Writes `bytes` as <tmp>/<name>.pt.
  std::string file(const std::string& name, const std::string& bytes) {
    const std::string path = tmp_ / (name + ".pt");
    testing::write_file(path, bytes);
    return path;
  }
  std::string pickle_file(const std::string& name, const std::string& pickle) {
    return file(name, zip_archive(records(pickle)));
  }
  testing::TempDir tmp_;
};

/// The UsageError message of loading `path` into a TwoVectors, "" when it loads.
std::string refusal(const std::string& path) {
  TwoVectors m;
  try {
    load_weights(m, path);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

/// refusal(path) in a child process whose address space may grow by 1 GiB at most: a reader
/// that allocates what the file declares, or a multiple of the file per opcode, runs out there
/// (or is stopped after a minute) instead of taking the machine's memory.
std::string refusal_within_1gib(const std::string& path) {
  return testing::run_bounded([&] { return "refusal: " + refusal(path); }).text;
}

TEST_F(TorchSaveBounds, AWellFormedCraftedFileLoads) {
  TwoVectors m;
  const std::string path = pickle_file("good", good_pickle());
  EXPECT_EQ(load_weights(m, path).loaded, 2);
  EXPECT_TRUE(m.w.equal(torch::tensor({1.5f, -2.f})));
  EXPECT_TRUE(m.v.equal(torch::tensor({0.25f, 4.f})));
}

TEST_F(TorchSaveBounds, AnIntegerPast64BitsBesideTheStateDictIsSkipped) {
  // A training checkpoint's seed of 2^64 - 1 (LONG1 of 9 bytes) beside its state_dict;
  // good_pickle() ends with STOP, which the wrapper's SETITEMS and STOP replace.
  const std::string inner = good_pickle().substr(kProto.size());
  const std::string wrapped = kProto + "}(" + unicode("seed") + "\x8a\x09" + std::string(8, '\xff') +
                              std::string(1, '\0') + unicode("state_dict") + inner.substr(0, inner.size() - 1) + "u.";
  TwoVectors m;
  EXPECT_EQ(load_weights(m, pickle_file("wrapped", wrapped)).loaded, 2);
  EXPECT_TRUE(m.w.equal(torch::tensor({1.5f, -2.f})));
}

TEST_F(TorchSaveBounds, AStringLongerThanTheFileIsRefusedBeforeItIsAllocated) {
  const std::string path = pickle_file("string", kProto + "\x8d" + le(1ull << 40, 8) + "abc");
  const std::string msg = refusal(path);
  EXPECT_NE(msg.find("model.weights = \"" + path + "\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("a string of 1099511627776 bytes, 3 left in data.pkl"), std::string::npos) << msg;
  const std::string bytes = refusal(pickle_file("bytes", kProto + "B" + le(0xFFFFFFF0, 4) + "abc"));
  EXPECT_NE(bytes.find("bytes of 4294967280 bytes, 3 left in data.pkl"), std::string::npos) << bytes;
}

TEST_F(TorchSaveBounds, TenMillionValuesAreRefusedAtTheCap) {
  // 10 MB of None: 10^7 values, each a few hundred bytes once unpickled.
  const std::string path = pickle_file("values", kProto + std::string(10'000'000, 'N') + ".");
  const std::string msg = refusal_within_1gib(path);
  EXPECT_NE(msg.find("data.pkl makes more than 1000000 values"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

TEST_F(TorchSaveBounds, NestingAMillionDeepIsRefused) {
  // A million tuples, each holding the one before (TUPLE1), and a million lists, each
  // appended to the one before.
  const std::string tuples = pickle_file("tuples", kProto + ")" + std::string(1'000'000, '\x85') + ".");
  std::string msg = refusal_within_1gib(tuples);
  EXPECT_NE(msg.find("nests lists, tuples and dicts more than 1000 deep"), std::string::npos) << msg;
  const std::string lists =
      pickle_file("lists", kProto + std::string(1'000'000, ']') + std::string(999'999, 'a') + ".");
  msg = refusal_within_1gib(lists);
  EXPECT_NE(msg.find("nests lists, tuples and dicts more than 1000 deep"), std::string::npos) << msg;
  const std::string marks = pickle_file("marks", kProto + std::string(1'000'000, '(') + ".");
  msg = refusal_within_1gib(marks);
  EXPECT_NE(msg.find("nests more than 1000 MARKs"), std::string::npos) << msg;
}

TEST_F(TorchSaveBounds, AListThatContainsItselfIsRefused) {
  const std::string msg = refusal(pickle_file("cycle", kProto + "]2a."));
  EXPECT_NE(msg.find("data.pkl holds a list that contains itself"), std::string::npos) << msg;
}

TEST_F(TorchSaveBounds, NamesBuiltFromMemoizedStringsDoNotMultiplyMemory) {
  // One string of 1 MiB, memoized, then 2,000 globals named after it twice (STACK_GLOBAL of
  // two memo reads, 6 bytes each) kept in a list: 4 GiB if each name copied the strings.
  std::string p = kProto + "X" + le(1 << 20, 4) + std::string(1 << 20, 'x') + std::string("q\0", 2) + "0" + "]";
  for (int i = 0; i < 2000; ++i) p += std::string("h\x00h\x00", 4) + "\x93" + "a";
  const std::string msg = refusal_within_1gib(pickle_file("names", p + "."));
  EXPECT_NE(msg.find("holds a list, not a state_dict"), std::string::npos) << msg;
}

TEST_F(TorchSaveBounds, AStorageWhoseDeclaredSizeIsNotItsRecordsIsRefused) {
  const std::string path =
      pickle_file("numel", state_dict({{"w", tensor("0", 1000, {2}, {1})}, {"v", tensor("1", 2, {2}, {1})}}));
  const std::string msg = refusal(path);
  EXPECT_NE(msg.find("data/0 holds 8 bytes, but its storage declares 1000 elements of Float"), std::string::npos)
      << msg;
}

TEST_F(TorchSaveBounds, ATensorPastItsStorageIsRefused) {
  // Two elements from offset 1 of a two-element storage; a stride that overflows int64.
  std::string msg =
      refusal(pickle_file("view", state_dict({{"w", tensor("0", 2, {2}, {1}, 1)}, {"v", tensor("1", 2, {2}, {1})}})));
  EXPECT_NE(msg.find("a tensor that reaches past its storage (2 elements)"), std::string::npos) << msg;
  msg = refusal(pickle_file("stride", state_dict({{"w", tensor("0", 2, {2, 2}, {1, std::int64_t(1) << 62})}})));
  EXPECT_NE(msg.find("a tensor that reaches past its storage (2 elements)"), std::string::npos) << msg;
  std::vector<std::int64_t> ones(100, 1);
  msg = refusal(pickle_file("dims", state_dict({{"w", tensor("0", 2, ones, ones)}})));
  EXPECT_NE(msg.find("a tensor of 100 dimensions (at most 64)"), std::string::npos) << msg;
}

TEST_F(TorchSaveBounds, ADeflatedEntryIsRefusedBeforeItIsInflated) {
  // data.pkl deflated, declaring 4 GiB where it holds a few hundred bytes: the size miniz
  // would allocate before inflating.
  auto entries = records(good_pickle());
  entries[0].deflate = true;
  entries[0].declared = 0xFFFFFFF0;
  std::string msg = refusal_within_1gib(file("deflated_pkl", zip_archive(entries)));
  EXPECT_NE(msg.find("entry 'archive/data.pkl' is deflated to 4294967280 declared bytes, past the 67108864"),
            std::string::npos)
      << msg;
  // A storage deflated with its true size: torch.save stores its records.
  entries = records(good_pickle());
  entries[1].deflate = true;
  msg = refusal_within_1gib(file("deflated_storage", zip_archive(entries)));
  EXPECT_NE(msg.find("record 'data/0' is compressed; torch.save stores its records"), std::string::npos) << msg;
}

TEST_F(TorchSaveBounds, ARecordDeclaredLargerThanTheFileIsRefusedBeforeItIsAllocated) {
  auto entries = records(good_pickle());
  entries[1].declared = 1ull << 31;
  std::string msg = refusal_within_1gib(file("past_end", zip_archive(entries)));
  EXPECT_NE(msg.find("entry 'archive/data/0' declares 2147483648 bytes at byte"), std::string::npos) << msg;
  EXPECT_NE(msg.find("past the end of the records"), std::string::npos) << msg;
  entries[1].declared = 1ull << 40;  // in a zip64 extra field
  msg = refusal_within_1gib(file("past_end64", zip_archive(entries)));
  EXPECT_NE(msg.find("entry 'archive/data/0' declares 1099511627776 bytes at byte"), std::string::npos) << msg;
}

TEST_F(TorchSaveBounds, OverlappingEntriesAreRefused) {
  // data/1's directory entry points at data/0's bytes: one stretch of the file read twice.
  auto entries = records(good_pickle());
  entries[2].data = entries[1].data;
  entries[2].data_of = 1;
  const std::string msg = refusal(file("overlap", zip_archive(entries)));
  EXPECT_NE(msg.find("two entries overlap"), std::string::npos) << msg;
}

TEST_F(TorchSaveBounds, TwoEntriesOfOneNameAreRefused) {
  auto entries = records(good_pickle());
  entries.push_back({"data/0", floats({9.f, 9.f}), false, std::nullopt, -1});
  const std::string msg = refusal(file("twice", zip_archive(entries)));
  EXPECT_NE(msg.find("two entries named 'archive/data/0'"), std::string::npos) << msg;
}

TEST_F(TorchSaveBounds, AStateDictKeyGivenTwiceIsRefused) {
  const std::string msg = refusal(pickle_file(
      "key_twice",
      state_dict({{"w", tensor("0", 2, {2}, {1})}, {"v", tensor("1", 2, {2}, {1})}, {"w", tensor("1", 2, {2}, {1})}})));
  EXPECT_NE(msg.find("'w' is in the state_dict twice"), std::string::npos) << msg;
}

}  // namespace
}  // namespace trainer
