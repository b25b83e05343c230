#include "worker/model/extend.h"

namespace tandem {

Visibility Visibility::Explicit(int n) {
  Visibility v;
  v.kind = Kind::kExplicit;
  v.n = n;
  v.bits.assign(static_cast<size_t>(n) * Words(n), 0);
  return v;
}

bool Visibility::Sees(int i, int j) const {
  switch (kind) {
    case Kind::kCausal:
      return j <= i;
    case Kind::kFull:
      return true;
    case Kind::kBlock:
      return j / block_size <= i / block_size;
    case Kind::kExplicit:
      return (bits[static_cast<size_t>(i) * Words(n) + j / 64] >> (j % 64)) & 1u;
  }
  return false;
}

void Visibility::ToBits(int count, std::vector<uint64_t>* out) const {
  const int words = Words(count);
  if (kind == Kind::kExplicit) {
    *out = bits;
    return;
  }
  out->assign(static_cast<size_t>(count) * words, 0);
  for (int i = 0; i < count; ++i) {
    uint64_t* row = out->data() + static_cast<size_t>(i) * words;
    for (int j = 0; j < count; ++j) {
      if (Sees(i, j)) row[j / 64] |= uint64_t{1} << (j % 64);
    }
  }
}

}  // namespace tandem
