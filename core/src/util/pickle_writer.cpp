#include "util/pickle_writer.h"

#include <cstdint>
#include <cstring>

#include "trainer/error.h"

namespace trainer::detail {

namespace {
// The opcodes of pickle protocol 2 this writer uses (Python's Lib/pickle.py names).
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kEmptyDict = '}';
constexpr char kEmptyList = ']';
constexpr char kMark = '(';
constexpr char kTuple = 't';
constexpr char kSetItems = 'u';
constexpr char kAppend = 'a';
constexpr char kBinInt = 'J';    // 4-byte signed, little-endian
constexpr char kLong1 = '\x8a';  // n bytes, two's complement, little-endian
constexpr char kBinUnicode = 'X';
constexpr char kBinFloat = 'G';  // 8-byte IEEE 754, big-endian
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kNone = 'N';

void little_endian(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
}  // namespace

PickleWriter::PickleWriter() {
  out_.push_back(kProto);
  out_.push_back('\x02');
}

void PickleWriter::added() {
  if (open_.empty()) return;
  ++count_.back();
  if (open_.back() == Open::List) out_.push_back(kAppend);
}

PickleWriter& PickleWriter::begin_dict() {
  out_.push_back(kEmptyDict);
  out_.push_back(kMark);
  open_.push_back(Open::Dict);
  count_.push_back(0);
  return *this;
}

PickleWriter& PickleWriter::begin_list() {
  out_.push_back(kEmptyList);
  open_.push_back(Open::List);
  count_.push_back(0);
  return *this;
}

PickleWriter& PickleWriter::begin_tuple() {
  out_.push_back(kMark);
  open_.push_back(Open::Tuple);
  count_.push_back(0);
  return *this;
}

PickleWriter& PickleWriter::end_dict() {
  TRAINER_CHECK(!open_.empty() && open_.back() == Open::Dict && count_.back() % 2 == 0,
                "PickleWriter: end_dict without a dict of whole items open");
  out_.push_back(kSetItems);
  open_.pop_back();
  count_.pop_back();
  added();
  return *this;
}

PickleWriter& PickleWriter::end_list() {
  TRAINER_CHECK(!open_.empty() && open_.back() == Open::List, "PickleWriter: end_list without a list open");
  open_.pop_back();
  count_.pop_back();
  added();
  return *this;
}

PickleWriter& PickleWriter::end_tuple() {
  TRAINER_CHECK(!open_.empty() && open_.back() == Open::Tuple, "PickleWriter: end_tuple without a tuple open");
  out_.push_back(kTuple);
  open_.pop_back();
  count_.pop_back();
  added();
  return *this;
}

void PickleWriter::check_fits(std::uint64_t v) {
  TRAINER_CHECK(v <= static_cast<std::uint64_t>(INT64_MAX), "PickleWriter: ", v, " does not fit in 64 signed bits");
}

PickleWriter& PickleWriter::integer(std::int64_t v) {
  if (v >= INT32_MIN && v <= INT32_MAX) {
    out_.push_back(kBinInt);
    little_endian(out_, static_cast<std::uint32_t>(static_cast<std::int32_t>(v)), 4);
  } else {
    out_.push_back(kLong1);
    out_.push_back('\x08');
    little_endian(out_, static_cast<std::uint64_t>(v), 8);
  }
  added();
  return *this;
}

PickleWriter& PickleWriter::value(std::string_view s) {
  out_.push_back(kBinUnicode);
  little_endian(out_, s.size(), 4);
  out_.append(s);
  added();
  return *this;
}

PickleWriter& PickleWriter::value(double v) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  out_.push_back(kBinFloat);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  added();
  return *this;
}

PickleWriter& PickleWriter::value(bool v) {
  out_.push_back(v ? kNewTrue : kNewFalse);
  added();
  return *this;
}

PickleWriter& PickleWriter::none() {
  out_.push_back(kNone);
  added();
  return *this;
}

const std::string& PickleWriter::finish() {
  TRAINER_CHECK(open_.empty(), "PickleWriter: ", open_.size(), " container(s) not ended");
  if (!finished_) out_.push_back(kStop);
  finished_ = true;
  return out_;
}

}  // namespace trainer::detail
