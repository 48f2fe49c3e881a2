#pragma once
// Private: reads a TorchScript archive as torch::serialize::OutputArchive writes it (trainer's
// checkpoints and adapter files) into an InputArchive, without torch::jit::load. jit::load
// compiles the archive's code/ and runs a class's __setstate__ while unpickling: a file handed
// over as a checkpoint could run anything. Here the archive is data only: its zip through
// ZipArchive, its data.pkl through trainer's unpickler in the TorchScript dialect (modules of
// tensors, numbers, strings, tuples and typed lists and dicts), the InputArchive's module tree
// built from that by hand. What only code could make is refused (ArchiveCodeError): any other
// call or object in data.pkl, an object built from anything but its attribute dict, a method
// (`def`) in code/, code constants. Bounded as read_torch_save is (torch_save.h), and further
// by the caps below.
#include <c10/core/Device.h>
#include <torch/serialize/input-archive.h>

#include <cstdint>
#include <string>

#include "model/torch_save.h"  // TorchSaveError and ArchiveCodeError, which it throws
#include "trainer/export.h"

namespace trainer::detail {

/// Modules one archive may hold. A ResNet-50 checkpoint with SGD's momentum holds about 500
/// (its modules, and one per parameter's optimizer state); each costs LibTorch a class type of
/// its own: a file of 100,000 modules was refused here after 2 s and 200 MB (the pickle's
/// values included).
inline constexpr std::int64_t kMaxScriptModules = 100'000;

/// Attribute names LibTorch may compare to build an archive's modules. A class type looks its
/// attributes up one by one, so a module of n attributes costs n(n+1)/2 comparisons (and every
/// read of the archive's reader as many again); trainer's largest, the optimizer's state (one
/// per parameter tensor), are a few hundred for a ResNet-50 or a BERT-large. 10^8 comparisons
/// take about 3 s (measured: 100,000 attributes in one module, 5 * 10^9 of them, took 147 s),
/// and allow modules of 10,000 attributes.
inline constexpr std::int64_t kMaxScriptAttributeLookups = 100'000'000;

/// Levels of modules, tuples, lists and dicts. trainer's checkpoints nest about 10 deep (the
/// checkpoint, the model's modules, a parameter's dotted name); the tree is built recursively.
inline constexpr std::int64_t kMaxScriptNesting = 100;

/// The archive at `path`, its tensors on `device`, as InputArchive::load_from(path, device)
/// reads it, without running anything in it. Throws ArchiveCodeError for what only code could
/// make (see above), TorchSaveError for a file that is not such an archive, damaged or past a
/// bound (the messages do not name the file: the caller does, and says what to do). An
/// out-of-memory error (c10::Error) while reading the tensors passes through as it is.
/// (Exported for its tests.)
TRAINER_API torch::serialize::InputArchive read_script_archive(const std::string& path, const c10::Device& device);

}  // namespace trainer::detail
