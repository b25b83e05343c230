#include "worker/tokenizer/internal/bpe_model.h"

#include <algorithm>

namespace tandem::tokenizer_internal {
namespace {

// Heap order: the lowest rank first; among equal ranks the leftmost pair.
bool PopsLater(const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
  if (a.rank != b.rank) return a.rank > b.rank;
  return a.pos > b.pos;
}

}  // namespace

void BpeModel::Tokenize(std::string_view piece, BpeScratch* scratch,
                        std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (data_.ignore_merges) {
    auto it = data_.raw_vocab.find(absl::string_view(piece.data(), piece.size()));
    if (it != data_.raw_vocab.end()) {
      out->push_back(it->second);
      return;
    }
  }

  // Initial symbols: one per byte. Bytes without a token become the unknown token (runs fused
  // when asked) or vanish, matching HF tokenizers' handling of characters outside the vocab.
  auto& symbols = scratch->symbols;
  symbols.clear();
  bool pending_unk = false;
  auto push = [&symbols](int32_t id) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, true});
  };
  for (const char c : piece) {
    const int32_t id = data_.byte_ids[static_cast<unsigned char>(c)];
    if (id >= 0) {
      if (pending_unk) push(data_.unk_id);
      pending_unk = false;
      push(id);
    } else if (data_.unk_id >= 0) {
      if (pending_unk && !data_.fuse_unk) push(data_.unk_id);
      pending_unk = true;
    }
  }
  if (pending_unk) push(data_.unk_id);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  auto& heap = scratch->heap;
  heap.clear();
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const BpeMerge* m = FindMerge(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), PopsLater);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), PopsLater);
    const BpeScratch::Candidate top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    BpeScratch::Symbol& right = symbols[left.next];
    // Entries go stale when a neighbour merged since they were pushed. Like HF tokenizers, an
    // entry is still taken when the current pair yields the same token, whatever its rank.
    const BpeMerge* current = FindMerge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;

    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;

    if (left.prev >= 0) {
      if (const BpeMerge* m = FindMerge(symbols[left.prev].id, left.id)) {
        heap.push_back({m->rank, left.prev, m->new_id});
        std::push_heap(heap.begin(), heap.end(), PopsLater);
      }
    }
    if (left.next >= 0) {
      if (const BpeMerge* m = FindMerge(left.id, symbols[left.next].id)) {
        heap.push_back({m->rank, top.pos, m->new_id});
        std::push_heap(heap.begin(), heap.end(), PopsLater);
      }
    }
  }

  for (const auto& symbol : symbols) {
    if (symbol.alive) out->push_back(symbol.id);
  }
}

}  // namespace tandem::tokenizer_internal
