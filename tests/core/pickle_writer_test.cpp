// The pickle writer against bytes Python's pickle.loads reads as
// [1, -1, 2**40, -2**40, 'é', True, False, None, 1.5, (0, 7), {'k': 2}, {}]
// (checked with Python 3.11 when written; the opcodes are protocol 2's).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "trainer/error.h"
#include "util/pickle_writer.h"

namespace trainer::detail {
namespace {

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

TEST(PickleWriter, WritesWhatPythonReads) {
  PickleWriter p;
  p.begin_list();
  p.value(1).value(-1).value(std::int64_t{1} << 40).value(-(std::int64_t{1} << 40));
  p.value("\xc3\xa9").value(true).value(false).none().value(1.5);
  p.begin_tuple().value(0).value(7).end_tuple();
  p.begin_dict().item("k", 2).end_dict();
  p.begin_dict().end_dict();
  p.end_list();
  EXPECT_EQ(hex(p.finish()),
            "80025d4a01000000614affffffff618a080000000000010000618a080000000000ffffff615802000000c3a961886189614e"
            "61473ff800000000000061284a000000004a0700000074617d2858010000006b4a0200000075617d2875612e");
}

TEST(PickleWriter, RefusesWhatIsNotWhole) {
  PickleWriter open;
  open.begin_list();
  EXPECT_THROW(open.finish(), Error);
  PickleWriter half;
  half.begin_dict().value("key");
  EXPECT_THROW(half.end_dict(), Error);
  PickleWriter wrong;
  wrong.begin_list();
  EXPECT_THROW(wrong.end_dict(), Error);
  PickleWriter big;
  EXPECT_THROW(big.value(std::uint64_t{1} << 63), Error);
}

}  // namespace
}  // namespace trainer::detail
