// read_script_archive (model/script_archive.h): trainer's TorchScript archives (checkpoints,
// adapter files) read as data, never through torch::jit::load. What OutputArchive writes reads
// back as LibTorch's own reader reads it; what only code could make (a method in code/, a call
// or an object in data.pkl other than LibTorch's pickler writes, a state that is not an
// attribute dict, code constants) is refused without running anything; the reader's caps hold.
// Hostile files are crafted byte by byte (tests/support/zip_writer.h), each breaking one rule.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <sstream>

#include "model/script_archive.h"
#include "support/hostile_archive.h"
#include "support/test_util.h"
#include "support/zip_writer.h"

namespace trainer {
namespace {

using detail::ArchiveCodeError;
using detail::read_script_archive;
using detail::TorchSaveError;
using testing::le;
using testing::TempDir;
using testing::write_file;
using testing::zip_archive;

/// Every key of `a` and its sub-archives, each with what it holds printed ("<dtype> [sizes]
/// values" for a tensor, the value and its type otherwise): two archives that print alike hold
/// the same.
std::string contents(torch::serialize::InputArchive& a, const std::string& prefix = "") {
  std::ostringstream os;
  std::vector<std::string> keys = a.keys();
  std::sort(keys.begin(), keys.end());
  for (const auto& key : keys) {
    at::Tensor t;
    torch::serialize::InputArchive sub;
    c10::IValue v;
    if (a.try_read(key, t)) {
      os << prefix << key << ": " << t.scalar_type() << " " << t.sizes() << " " << t.flatten().to(at::kDouble) << "\n";
    } else if (a.try_read(key, sub)) {
      os << contents(sub, prefix + key + ".");
    } else {
      a.read(key, v);
      os << prefix << key << ": " << v << " : " << v.type()->annotation_str() << "\n";
    }
  }
  return os.str();
}

/// An archive of every kind of value trainer and LibTorch's optimizers write, nested.
void write_everything(const std::string& path) {
  torch::serialize::OutputArchive ar, inner(ar.compilation_unit()), deeper(ar.compilation_unit());
  ar.write("weight", torch::randn({3, 4}));
  ar.write("step", at::tensor(7));
  ar.write("moments", torch::randn({5}).to(at::kBFloat16), /*is_buffer=*/true);
  ar.write("mask", torch::tensor({true, false}));
  ar.write("config", c10::IValue("[model]\nname = \"mlp\"\n"));
  ar.write("count", c10::IValue(std::int64_t{-3}));
  ar.write("lr", c10::IValue(0.25));
  ar.write("amsgrad", c10::IValue(false));
  ar.write("betas", c10::IValue(std::make_tuple(0.9, 0.999)));
  ar.write("nothing", c10::IValue());
  ar.write("ints", c10::IValue(std::vector<std::int64_t>{1, 2, 3}));
  ar.write("doubles", c10::IValue(std::vector<double>{0.5}));
  ar.write("bools", c10::IValue(c10::List<bool>({true})));
  ar.write("tensors", c10::IValue(c10::List<at::Tensor>({torch::ones({2}), torch::zeros({1})})));
  ar.write("names", c10::IValue(c10::List<std::string>({"a", "b"})));
  c10::Dict<std::string, at::Tensor> by_name;
  by_name.insert("x", torch::arange(4));
  ar.write("by_name", c10::IValue(by_name));
  c10::Dict<std::int64_t, c10::List<double>> nested;
  nested.insert(1, c10::List<double>({1.5, 2.5}));
  ar.write("nested", c10::IValue(nested));
  deeper.write("scalar", at::scalar_tensor(2.5, at::kDouble));
  inner.write("deeper", deeper);
  inner.write("bias", torch::randn({4}));
  ar.write("inner", inner);
  ar.save_to(path);
}

/// Writes the archive of `records` (name, bytes) as <tmp>/<name>.pt.
std::string archive_file(const TempDir& tmp, const std::string& name,
                         const std::vector<std::pair<std::string, std::string>>& records) {
  std::vector<testing::ZipEntry> entries;
  for (const auto& [record, bytes] : records) entries.push_back({record, bytes, false, std::nullopt, -1});
  const std::string path = tmp / (name + ".pt");
  write_file(path, zip_archive(entries));
  return path;
}

const std::string kProto = "\x80\x02";
const std::string kEmptyConstants = kProto + ").";
std::string unicode(const std::string& s) { return "X" + le(s.size(), 4) + s; }
std::string global(const std::string& module, const std::string& name) { return "c" + module + "\n" + name + "\n"; }
/// A module of class __torch__.Module, its attribute dict `items` (pickled key, value pairs).
std::string module(const std::string& items) { return global("__torch__", "Module") + ")\x81}(" + items + "ub"; }
/// An archive whose data.pkl is `pickle`, with an empty constants.pkl and no code.
std::string data_file(const TempDir& tmp, const std::string& name, const std::string& pickle) {
  return archive_file(tmp, name, {{"data.pkl", pickle}, {"constants.pkl", kEmptyConstants}, {"version", "3\n"}});
}

/// The TorchSaveError message of reading `path`, "" when it reads.
std::string refusal(const std::string& path) {
  try {
    read_script_archive(path, at::kCPU);
  } catch (const TorchSaveError& e) {
    return e.what();
  }
  return "";
}

TEST(ScriptArchive, ReadsWhatOutputArchiveWroteAsLibTorchDoes) {
  TempDir tmp;
  const std::string path = tmp / "everything.pt";
  write_everything(path);
  torch::serialize::InputArchive ours = read_script_archive(path, at::kCPU), libtorch;
  libtorch.load_from(path);  // trainer wrote it just now: LibTorch's reader may run it
  const std::string expected = contents(libtorch);
  EXPECT_EQ(contents(ours), expected);
  // What the readers do with it: a typed list, the optimizer's tuple, a dict of tensors.
  c10::IValue v;
  ours.read("ints", v);
  EXPECT_EQ(v.toIntVector(), (std::vector<std::int64_t>{1, 2, 3}));
  ours.read("betas", v);
  EXPECT_EQ((v.to<std::tuple<double, double>>()), std::make_tuple(0.9, 0.999));
  ours.read("by_name", v);
  EXPECT_TRUE(v.toGenericDict().at("x").toTensor().equal(torch::arange(4)));
  EXPECT_NE(expected.find("nested: {1: [1.5, 2.5]} : Dict[int, List[float]]"), std::string::npos) << expected;
}

TEST(ScriptArchive, TensorsLandOnTheDeviceAskedAndViewsStayViewsOfOneStorage) {
  TempDir tmp;
  torch::serialize::OutputArchive ar;
  const at::Tensor base = torch::arange(6, at::kFloat);
  ar.write("whole", base);
  ar.write("part", base.narrow(0, 2, 3));
  ar.save_to(tmp / "views.pt");
  torch::serialize::InputArchive in = read_script_archive(tmp / "views.pt", c10::kMeta);
  at::Tensor whole, part;
  in.read("whole", whole);
  in.read("part", part);
  EXPECT_TRUE(whole.is_meta());
  EXPECT_TRUE(part.is_meta());
  EXPECT_EQ(part.storage_offset(), 2);
  EXPECT_EQ(whole.storage().unsafeGetStorageImpl(), part.storage().unsafeGetStorageImpl());
}

TEST(ScriptArchive, AClassThatDeclaresAMethodIsRefusedAndNothingRuns) {
  TempDir tmp;
  const std::string marker = tmp / "ran";
  write_file(tmp / "hostile.pt", testing::hostile_archive(marker));
  const std::string msg = refusal(tmp / "hostile.pt");
  EXPECT_NE(msg.find("code/__torch__.py declares a method, which torch::jit::load would compile and may run: "
                     "\"def __getstate__(self: __torch__.Evil) -> Tuple[str, bool]:\""),
            std::string::npos)
      << msg;
  EXPECT_THROW(read_script_archive(tmp / "hostile.pt", at::kCPU), ArchiveCodeError);
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(ScriptArchive, MethodsAreFoundWhereverTheyAreDeclaredButNotInNames) {
  TempDir tmp;
  // An attribute named "def x": LibTorch's writer declares it in a string.
  torch::serialize::OutputArchive ar;
  ar.write("def x", torch::ones({1}));
  ar.save_to(tmp / "named.pt");
  torch::serialize::InputArchive in = read_script_archive(tmp / "named.pt", at::kCPU);
  at::Tensor t;
  EXPECT_TRUE(in.try_read("def x", t));
  // A method on the class's own line.
  const std::string path =
      archive_file(tmp, "inline",
                   {{"data.pkl", kProto + module("") + "."},
                    {"code/__torch__.py", "class Module(Module): def f(self: Module) -> None: pass\n"},
                    {"constants.pkl", kEmptyConstants}});
  EXPECT_NE(refusal(path).find("code/__torch__.py declares a method, which torch::jit::load would compile and may run: "
                               "\"def f(self: Module) -> None: pass\""),
            std::string::npos)
      << refusal(path);
}

TEST(ScriptArchive, AnObjectBuiltFromAnythingButItsAttributeDictIsRefused) {
  TempDir tmp;
  // What a class with __setstate__ pickles: the object, then BUILD from the state it returns.
  const std::string path = data_file(
      tmp, "setstate", kProto + global("__torch__", "Evil") + ")\x81" + unicode("/tmp/x") + "\x88\x86" + "b.");
  EXPECT_NE(refusal(path).find("data.pkl builds a __torch__.Evil from a tuple, not from the dict of its attributes"),
            std::string::npos)
      << refusal(path);
  EXPECT_THROW(read_script_archive(path, at::kCPU), ArchiveCodeError);
}

TEST(ScriptArchive, CallsAndObjectsOtherThanLibTorchsPicklerWritesAreRefusedNamingThem) {
  TempDir tmp;
  std::string msg = refusal(data_file(tmp, "call", kProto + global("os", "system") + "(" + unicode("touch x") + "tR."));
  EXPECT_NE(msg.find("data.pkl calls os.system"), std::string::npos) << msg;
  msg = refusal(data_file(tmp, "object", kProto + global("collections", "OrderedDict") + ")\x81."));
  EXPECT_NE(msg.find("data.pkl makes an object of global collections.OrderedDict"), std::string::npos) << msg;
  msg = refusal(data_file(tmp, "arguments", kProto + global("__torch__", "Module") + "(K\x01t\x81."));
  EXPECT_NE(msg.find("data.pkl makes a __torch__.Module with arguments"), std::string::npos) << msg;
  // A global as a value, and an opaque object that torch.save's dialect would keep: refused.
  msg = refusal(data_file(tmp, "global", kProto + module(unicode("f") + global("os", "system")) + "."));
  EXPECT_NE(msg.find("data.pkl holds a global os.system as a value"), std::string::npos) << msg;
}

TEST(ScriptArchive, CodeConstantsAreRefused) {
  TempDir tmp;
  const std::string path = archive_file(
      tmp, "constants", {{"data.pkl", kProto + module("") + "."}, {"constants.pkl", kProto + "K\x01\x85."}});
  EXPECT_NE(refusal(path).find("constants.pkl holds code constants (a tuple of 1), which only code reads"),
            std::string::npos)
      << refusal(path);
}

TEST(ScriptArchive, AModuleThatContainsItselfIsRefused) {
  TempDir tmp;
  // The module memoized as 0, then set as its own attribute "me".
  const std::string path =
      data_file(tmp, "cycle", kProto + global("__torch__", "Module") + ")\x81q\x01}(" + unicode("me") + "h\x01ub.");
  EXPECT_NE(refusal(path).find("data.pkl holds a __torch__.Module object that contains itself"), std::string::npos)
      << refusal(path);
}

TEST(ScriptArchive, AListOrDictIsCheckedAgainstItsType) {
  TempDir tmp;
  const std::string tag = global("torch.jit._pickle", "restore_type_tag");
  std::string msg = refusal(data_file(
      tmp, "list",
      kProto + module(unicode("l") + tag + "](" + unicode("a") + "e" + unicode("List[int]") + "\x86R") + "."));
  EXPECT_NE(msg.find("data.pkl holds a str in a list of type \"List[int]\""), std::string::npos) << msg;
  msg = refusal(data_file(tmp, "untagged", kProto + module(unicode("l") + "]") + "."));
  EXPECT_NE(msg.find("data.pkl holds a list without its TorchScript type"), std::string::npos) << msg;
  msg = refusal(
      data_file(tmp, "type", kProto + module(unicode("l") + tag + "]" + unicode("List[os.system]") + "\x86R") + "."));
  EXPECT_NE(msg.find("a list or dict of type \"List[os.system]\": 'os' at character 7"), std::string::npos) << msg;
  // A key type no dict may have: LibTorch's type says so.
  msg = refusal(data_file(tmp, "key",
                          kProto + module(unicode("d") + tag + "}" + unicode("Dict[List[int], int]") + "\x86R") + "."));
  EXPECT_NE(msg.find("data LibTorch refuses (Cannot create dict for key type"), std::string::npos) << msg;
}

TEST(ScriptArchive, ModulesNestedPastTrainersAreRefused) {
  TempDir tmp;
  std::string pickle = kProto;
  for (int i = 0; i < detail::kMaxScriptNesting + 1; ++i)
    pickle += global("__torch__", "Module") + ")\x81}(" + unicode("m");
  pickle += global("__torch__", "Module") + ")\x81}b";
  for (int i = 0; i < detail::kMaxScriptNesting + 1; ++i) pickle += "ub";
  const std::string msg = refusal(data_file(tmp, "deep", pickle + "."));
  EXPECT_NE(msg.find("nests modules, tuples, lists and dicts more than 100 deep"), std::string::npos) << msg;
}

TEST(ScriptArchive, ModulesPastTheCapAreRefused) {
  TempDir tmp;
  // A root of 1,000 modules of 100 modules of no attributes each: one past the cap, the class memoized.
  const std::string empty = "h\x01)\x81}b";
  std::string pickle = kProto + global("__torch__", "Module") + "q\x01)\x81}(";
  for (std::int64_t i = 0; i < detail::kMaxScriptModules / 100; ++i) {
    pickle += unicode(std::to_string(i)) + "h\x01)\x81}(";
    for (int j = 0; j < 100; ++j) pickle += unicode(std::to_string(j)) + empty;
    pickle += "ub";
  }
  const std::string msg = refusal(data_file(tmp, "many", pickle + "ub."));
  EXPECT_NE(msg.find("data.pkl holds more than 100000 modules"), std::string::npos) << msg;
}

TEST(ScriptArchive, ModulesOfTooManyAttributesAreRefused) {
  TempDir tmp;
  // Two modules of 10,000 attributes each: 2 * 10^8 / 2 comparisons, past the cap.
  std::string pickle = kProto + global("__torch__", "Module") + "q\x01)\x81}(";
  for (int m = 0; m < 2; ++m) {
    pickle += unicode("m" + std::to_string(m)) + "h\x01)\x81}(";
    for (int i = 0; i < 10'001; ++i) pickle += unicode(std::to_string(i)) + "N";
    pickle += "ub";
  }
  const std::string msg = refusal(data_file(tmp, "wide", pickle + "ub."));
  EXPECT_NE(msg.find("data.pkl holds modules of too many attributes (10001 in one)"), std::string::npos) << msg;
}

}  // namespace
}  // namespace trainer
