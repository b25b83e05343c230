// The verifier engine's connection to one drafter: drafting sessions of many sequences
// multiplexed over one channel (see proto/tandem/v1/drafter.proto for the protocol). The gRPC
// implementation lives with the services; tests use an in-process one. Keeping the interface
// here keeps gRPC out of worker/.
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/sampling/grammar.h"

// cudaStream_t is `CUstream_st*`; naming the struct keeps CUDA headers out of this interface.
struct CUstream_st;

namespace tandem {

// Hidden rows that stayed in GPU memory on their way to the drafter (a GPU-to-GPU transport
// delivering straight to a drafter whose model runs on that GPU): an owned bf16
// [layers, tokens, hidden_size] device buffer that becomes ready on the GPU after the copy that
// fills it. Dropping the last reference hands the buffer back to its owner, which reuses it only
// after every read issued through Read has run on the GPU.
//
// Thread-safety: Read may be called from any thread, one call at a time per payload.
class DeviceHiddenPayload {
 public:
  // Gets the device rows and a stream (a cudaStream_t) on which they are ready; must queue its
  // reads of the rows on that stream, or order them before the stream's later work (as
  // DFlashModel::AppendContextDevice does).
  using Reader = std::function<absl::Status(const void* rows, CUstream_st* stream)>;

  virtual ~DeviceHiddenPayload() = default;
  // The CUDA device the rows are on.
  virtual int device() const = 0;
  // Runs `read` (on the calling thread, without waiting for the GPU) and returns its status, or
  // the CUDA error that kept it from running.
  virtual absl::Status Read(const Reader& read) const = 0;
};

// Draft tokens for sequence indices [from, from + tokens.size()) of one session. A chain whose
// `from` equals the end of the session's previous chain extends it; any other replaces it. A
// non-OK `error` ends the session's drafting (its sequence continues without drafts).
// A block draft (`slots` not empty, one per token) is for the block starting at `from`:
// tokens[r] is for slot slots[r], in the drafter's decoding order; it always replaces.
struct DraftChain {
  uint64_t session = 0;
  int from = 0;
  std::vector<int32_t> tokens;
  absl::Status error;
  std::vector<int32_t> slots;
  // An alternative to the session's chain for a likely partial acceptance (drafter.proto,
  // DraftChain.branch): kept beside it, never replacing it.
  bool branch = false;
};

// Target hidden states of consecutive tokens of one session, for drafters conditioned on them
// (DFlash-style): rows for sequence indices [offset, offset + tokens) of each requested layer,
// in the order the drafter listed its layers. `tokens == 0` means none. The values are either in
// `bf16` (host memory) or, on the drafter's side of a GPU-to-GPU transport, in `device` (then
// `bf16` is empty).
struct HiddenRows {
  int layers = 0;
  int tokens = 0;
  int hidden_size = 0;
  int offset = 0;
  std::vector<uint16_t> bf16;  // [layers, tokens, hidden_size] bfloat16 bits
  std::shared_ptr<const DeviceHiddenPayload> device;

  bool empty() const { return tokens == 0; }
};

// fp32 -> bf16 with round-to-nearest-even (NaN stays a quiet NaN).
inline uint16_t FloatToBf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float Bf16ToFloat(uint16_t value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value) << 16);
}

// A session's structured output (drafter.proto, DraftOpen.grammar_type): the drafter drafts
// under the same grammar.
struct DraftGrammar {
  GrammarSpec spec;
  int prompt_len = 0;                // leading tokens of the session that are the prompt
  std::vector<int32_t> stop_tokens;  // the sequence's
};

class DraftChannel {
 public:
  // Called from any thread, possibly after the channel's calls returned; must not block.
  using ChainCallback = std::function<void(DraftChain)>;

  virtual ~DraftChannel() = default;

  // None of these block on the network. An error means the channel is broken; chains with an
  // error follow for every open session. `hidden` carries the target's hidden states of the
  // layers hidden_layers() names for tokens whose KV became final (see drafter.proto); it is
  // empty unless the drafter asked for layers. `block_size` > 0 asks for block drafts of blocks
  // of that many slots after the tokens (see drafter.proto, DraftOpen.block_size). `grammar`:
  // the session's structured output, if any (drafts then follow it).
  virtual absl::Status Open(uint64_t session, std::span<const int32_t> tokens, int gamma,
                            const HiddenRows& hidden, int block_size,
                            const std::optional<DraftGrammar>& grammar) = 0;
  virtual absl::Status Advance(uint64_t session, int offset, std::span<const int32_t> append,
                               int gamma, const HiddenRows& hidden) = 0;
  absl::Status Open(uint64_t session, std::span<const int32_t> tokens, int gamma) {
    return Open(session, tokens, gamma, HiddenRows{}, 0, std::nullopt);
  }
  absl::Status Open(uint64_t session, std::span<const int32_t> tokens, int gamma,
                    const HiddenRows& hidden) {
    return Open(session, tokens, gamma, hidden, 0, std::nullopt);
  }
  absl::Status Advance(uint64_t session, int offset, std::span<const int32_t> append, int gamma) {
    return Advance(session, offset, append, gamma, HiddenRows{});
  }
  virtual void Close(uint64_t session) = 0;
  // False once the channel is broken for good (the engine then opens a new one on the next
  // request that names this drafter).
  virtual bool healthy() const = 0;
  // Whether the drafter is reachable now (a transport that can tell: connected). A driver does
  // not wait for chains from a channel that is not: a drafter that is down costs no step any
  // time, and drafting resumes when it is back. Default: always.
  virtual bool connected() const { return true; }
  // The target layers whose hidden states the drafter wants with every final token (each in
  // [0, num_layers]: the residual stream after that many layers); empty = none, which is also
  // the answer until the drafter has said. Callers read it once per session, at Open.
  virtual std::vector<int32_t> hidden_layers() const { return {}; }
};

// Makes a channel to the drafter at `address`; `on_chain` receives every chain.
using DraftChannelFactory = std::function<absl::StatusOr<std::unique_ptr<DraftChannel>>(
    const std::string& address, DraftChannel::ChainCallback on_chain)>;

}  // namespace tandem
