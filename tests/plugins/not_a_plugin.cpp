// Test library: a shared object without the trainer plugin entry points.
extern "C" __attribute__((visibility("default"))) int not_a_trainer_plugin() { return 42; }
