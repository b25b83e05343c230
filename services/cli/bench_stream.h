// Client-side timing of one streamed generation (a router's Generation.Generate or a verifier's
// Verifier.Generate; both stream GenerateResponse), shared by `tandem bench serve` and
// `tandem bench router`.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/sync_stream.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "tandem/v1/generate.pb.h"

namespace tandem::cli {

using BenchClock = std::chrono::steady_clock;

// What a client saw of one stream. Times are seconds after the call started.
struct TimedStream {
  grpc::Status status;
  std::vector<int32_t> tokens;
  // Each message that carried tokens: when it was read and how many it carried.
  struct Chunk {
    double time = 0;
    int tokens = 0;
  };
  std::vector<Chunk> chunks;
  double end = 0;    // when the stream finished (Finish returned)
  std::string mode;  // the mode the server reported on its last message
  std::string finish_reason;
  std::string text;  // the completion's text
  v1::Usage usage;   // the last message's

  bool ok() const { return status.ok(); }
  // Time to the first token; 0 when none came.
  double FirstToken() const { return chunks.empty() ? 0 : chunks.front().time; }
  // Inter-token latencies: a message of n tokens that arrives g seconds after the previous
  // token-bearing message gives each of its n tokens a latency of g / n (one sample per token
  // after the first; the first message's other tokens count 0). A message per token (AR) gives
  // exact per-token gaps.
  std::vector<double> InterTokenLatencies() const;
};

// Reads a started call to the end and times it from `start` (taken just before the call).
TimedStream ReadTimed(grpc::ClientReaderInterface<v1::GenerateResponse>& reader,
                      BenchClock::time_point start);

// A benchmark's mode variant: "MODE", or "MODE@FORMAT" for MODE with structured output, FORMAT
// json_object or json_schema (kBenchJsonSchema).
struct ModeVariant {
  std::string mode;
  std::string format;  // "" = free text
};
// InvalidArgument for an unknown FORMAT.
absl::StatusOr<ModeVariant> ParseModeVariant(const std::string& variant);
// The schema of the json_schema variants: a small object of a boolean, an enum and a bounded
// integer, which a model can finish within a short budget.
inline constexpr char kBenchJsonSchema[] =
    R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", )"
    R"("high"]}, "score": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["ok", )"
    R"("level", "score"]})";

// A greedy request for `max_tokens` new tokens of `prompt` in `mode` (a ModeVariant's text: a
// format that does not parse is sent as the mode, for the server to refuse).
v1::GenerateRequest MakeRequest(const std::string& prompt, const std::string& mode, int max_tokens);

// One greedy generation through `stub`, read to the end and timed from `start` (taken just
// before the call); the call's deadline is `timeout` from now.
TimedStream Generate(v1::Generation::Stub& stub, const std::string& prompt, const std::string& mode,
                     int max_tokens, BenchClock::time_point start,
                     std::chrono::seconds timeout = std::chrono::minutes(10));

// Waits until the router at `address` knows a model. It answers ListModels from the verifiers
// it has heard from, so the list is empty until its first poll of a verifier succeeded; a
// verifier calibrates its cost model before it listens, so from then on the router's mode
// policy has that cost model too. A router that does not answer at all is an error at once.
absl::StatusOr<v1::ListModelsResponse> WaitForModels(v1::Generation::Stub& stub,
                                                     const std::string& address,
                                                     absl::Duration timeout);

// The q-quantile (0..1) of `values` by the nearest-rank rule; 0 when empty.
double Quantile(std::vector<double> values, double q);

// "code 14 (UNAVAILABLE): message", for error summaries.
std::string DescribeStatus(const grpc::Status& status);

}  // namespace tandem::cli
