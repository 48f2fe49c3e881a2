#pragma once
// Weights a file is about to overwrite need no random initialisation: drawing BERT-base's 110 M
// random numbers took most of its load (about 1.7 s of 1.9 s on 2 cores, and longer in bf16).
namespace trainer::detail {

/// While one is alive on this thread, trainer::Linear and model "bert"'s layers leave the
/// weights they create uninitialised; whoever holds it loads every weight or initialises those
/// the file lacks.
class DeferInit {
 public:
  DeferInit();
  ~DeferInit();
  DeferInit(const DeferInit&) = delete;
  DeferInit& operator=(const DeferInit&) = delete;
  static bool active();

 private:
  bool before_;
};

}  // namespace trainer::detail
