// The unpickler's opcode loop over data.pkl, and its reading of data.pkl's bytes: lengths,
// integers, floats, strings and GLOBAL's lines, each checked against what is left.
#include "model/torch_save_unpickler.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>

namespace trainer::detail {

PyRef Unpickler::run() {
  for (;;) {
    const std::uint8_t op = u8();
    switch (op) {
      case 0x80:
        u8();
        break;  // PROTO
      case 0x95:
        take(8);
        break;     // FRAME (protocol 4)
      case '.': {  // STOP
        PyRef result = pop();
        check_nesting(result);
        return result;
      }
      case '(':  // MARK
        if (marks_.size() >= static_cast<std::size_t>(kMaxPickleNesting)) {
          throw TorchSaveError(source_.name + " nests more than " + std::to_string(kMaxPickleNesting) +
                               " MARKs (at byte " + std::to_string(pos_ - 1) +
                               "); Python's pickle never writes that deep");
        }
        marks_.push_back(stack_.size());
        break;
      case '0':
        pop();
        break;  // POP
      case '1':
        pop_mark();
        break;  // POP_MARK
      case '2':
        push(top());
        break;  // DUP
      case 'N':
        push(make(Kind::None));
        break;
      case 0x88:
        push(boolean(true));
        break;
      case 0x89:
        push(boolean(false));
        break;
      case 'J':
        push(integer(static_cast<std::int32_t>(le(4))));
        break;  // BININT
      case 'K':
        push(integer(static_cast<std::int64_t>(le(1))));
        break;  // BININT1
      case 'M':
        push(integer(static_cast<std::int64_t>(le(2))));
        break;  // BININT2
      case 0x8a:
        push(long_int(u8()));
        break;  // LONG1
      case 0x8b:
        push(long_int(le(4)));
        break;  // LONG4
      case 'G':
        push(real());
        break;  // BINFLOAT
      case 'X':
        push(string(Kind::String, le(4)));
        break;  // BINUNICODE
      case 0x8c:
        push(string(Kind::String, u8()));
        break;  // SHORT_BINUNICODE
      case 0x8d:
        push(string(Kind::String, le(8)));
        break;  // BINUNICODE8
      case 'B':
        push(string(Kind::Bytes, le(4)));
        break;  // BINBYTES
      case 'C':
        push(string(Kind::Bytes, u8()));
        break;  // SHORT_BINBYTES
      case 0x8e:
        push(string(Kind::Bytes, le(8)));
        break;  // BINBYTES8
      case ')':
        push(make(Kind::Tuple));
        break;
      case 0x85:
      case 0x86:
      case 0x87:
        push(tuple_of(pop_n(op - 0x84)));
        break;  // TUPLE1..3
      case 't':
        push(tuple_of(pop_mark()));
        break;
      case ']':
        push(make(Kind::List));
        break;
      case 'l': {
        auto l = make(Kind::List);
        add_items(*l, pop_mark());
        push(l);
        break;
      }  // LIST
      case 'a': {
        auto v = pop();
        add_items(*list(top()), {v});
        break;
      }  // APPEND
      case 'e': {
        auto vs = pop_mark();
        add_items(*list(top()), vs);
        break;
      }  // APPENDS
      case '}':
        push(make(Kind::Dict));
        break;
      case 'd': {
        auto d = make(Kind::Dict);
        set_items(*d, pop_mark());
        push(d);
        break;
      }  // DICT
      case 's': {
        auto v = pop();
        auto k = pop();
        set_items(*dict(top()), {k, v});
        break;
      }
      case 'u': {
        auto kvs = pop_mark();
        set_items(*dict(top()), kvs);
        break;
      }
      case 'q':
        memo(le(1));
        break;  // BINPUT
      case 'r':
        memo(le(4));
        break;  // LONG_BINPUT
      case 0x94:
        memo(memo_.size());
        break;  // MEMOIZE
      case 'h':
        push(recall(le(1)));
        break;  // BINGET
      case 'j':
        push(recall(le(4)));
        break;     // LONG_BINGET
      case 'c': {  // GLOBAL "module\nname\n"
        const std::string module = line(), name = line();
        push(global(module + "." + name));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        auto name = pop(), module = pop();
        if (module->kind != Kind::String || name->kind != Kind::String) malformed("STACK_GLOBAL without strings");
        push(global(module->text.substr(0, kMaxNameBytes) + "." + name->text.substr(0, kMaxNameBytes)));
        break;
      }
      case 'R': {
        auto args = pop();
        auto fn = pop();
        push(reduce(*fn, *args));
        break;
      }  // REDUCE
      case 0x81: {
        auto args = pop();
        auto cls = pop();
        push(new_object(*cls, args.get()));
        break;
      }  // NEWOBJ
      case 'b':
        build(pop());
        break;  // BUILD
      // Protocol 4/5 containers and constructors that a state_dict never holds: kept opaque.
      case 0x8f:
        push(object("set"));
        break;  // EMPTY_SET
      case 0x90:
        pop_mark();
        top();
        break;  // ADDITEMS
      case 0x91:
        pop_mark();
        push(object("frozenset"));
        break;  // FROZENSET
      case 0x92: {
        pop();
        pop();
        auto cls = pop();
        push(new_object(*cls, nullptr));
        break;
      }  // NEWOBJ_EX
      case 0x96:
        push(string(Kind::Bytes, le(8)));
        break;  // BYTEARRAY8
      case 'Q':
        push(storage(*pop()));
        break;  // BINPERSID
      default: {
        std::ostringstream os;
        os << "pickle opcode 0x" << std::hex << int(op) << " at byte " << std::dec << (pos_ - 1) << " of "
           << source_.name << ", outside the data that torch.save writes";
        throw TorchSaveError(os.str());
      }
    }
  }
}

void Unpickler::malformed(const std::string& what) const {
  throw TorchSaveError(source_.name + " is malformed (" + what + " at byte " + std::to_string(pos_) + ")");
}

const char* Unpickler::take(std::size_t n) {
  if (n > data_.size() - pos_) malformed("truncated");
  const char* p = data_.data() + pos_;
  pos_ += n;
  return p;
}

std::uint8_t Unpickler::u8() { return static_cast<std::uint8_t>(*take(1)); }

std::uint64_t Unpickler::le(std::size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(take(n));
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t(p[i]) << (8 * i);
  return v;
}

std::string Unpickler::line() {
  const std::size_t end = data_.find('\n', pos_);
  if (end == std::string::npos) malformed("GLOBAL without a newline");
  std::string s = data_.substr(pos_, std::min(end - pos_, kMaxNameBytes));
  pos_ = end + 1;
  return s;
}

PyRef Unpickler::long_int(std::uint64_t n) {
  if (n > 8) {
    if (n > data_.size() - pos_) malformed("an integer of " + std::to_string(n) + " bytes past the end");
    if (script()) malformed("an integer of " + std::to_string(n) + " bytes, which LibTorch's pickler never writes");
    take(n);
    return object("int of " + std::to_string(n) + " bytes");
  }
  std::uint64_t v = le(n);
  if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~std::uint64_t(0) << (8 * n);  // sign-extend
  return integer(static_cast<std::int64_t>(v));
}

PyRef Unpickler::real() {
  const auto* p = reinterpret_cast<const unsigned char*>(take(8));
  std::uint64_t bits = 0;
  for (int i = 0; i < 8; ++i) bits = bits << 8 | p[i];  // big-endian
  double d;
  std::memcpy(&d, &bits, sizeof d);
  auto v = make(Kind::Float);
  v->real = d;
  return v;
}

PyRef Unpickler::string(Kind k, std::uint64_t n) {
  if (n > data_.size() - pos_) {
    malformed((k == Kind::String ? "a string of " : "bytes of ") + std::to_string(n) + " bytes, " +
              std::to_string(data_.size() - pos_) + " left in data.pkl,");
  }
  auto v = make(k);
  v->text.assign(take(n), n);
  return v;
}

}  // namespace trainer::detail
