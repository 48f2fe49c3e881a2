#pragma once
// AddressSanitizer refuses dlopen with RTLD_DEEPBIND, which trainer's SentencePiece module needs
// beside LibTorch's libprotobuf (core/src/text/sentencepiece_model.h says why): in a sanitizer
// build (scripts/sanitize.sh) the tests of SentencePiece models skip, saying so.
#include <gtest/gtest.h>

#if defined(__SANITIZE_ADDRESS__)
#define TRAINER_SENTENCEPIECE_UNAVAILABLE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRAINER_SENTENCEPIECE_UNAVAILABLE 1
#endif
#endif

#ifdef TRAINER_SENTENCEPIECE_UNAVAILABLE
#define TRAINER_SKIP_WITHOUT_SENTENCEPIECE() \
  GTEST_SKIP() << "AddressSanitizer build: SentencePiece models need dlopen with RTLD_DEEPBIND"
#else
#define TRAINER_SKIP_WITHOUT_SENTENCEPIECE() static_cast<void>(0)
#endif
