#pragma once
/// Symbol visibility for libtrainer_core. Everything not marked TRAINER_API is hidden.
#if defined(_WIN32)
#define TRAINER_API __declspec(dllexport)
#else
#define TRAINER_API __attribute__((visibility("default")))
#endif
