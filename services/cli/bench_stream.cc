#include "services/cli/bench_stream.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::cli {

absl::StatusOr<ModeVariant> ParseModeVariant(const std::string& variant) {
  const size_t at = variant.find('@');
  if (at == std::string::npos) return ModeVariant{.mode = variant};
  ModeVariant v{.mode = variant.substr(0, at), .format = variant.substr(at + 1)};
  if (v.format != "json_object" && v.format != "json_schema") {
    return absl::InvalidArgumentError(absl::StrCat("'", variant, "': the format after '@' must be ",
                                                   "json_object or json_schema"));
  }
  return v;
}

v1::GenerateRequest MakeRequest(const std::string& prompt, const std::string& mode,
                                int max_tokens) {
  v1::GenerateRequest request;
  request.set_prompt(prompt);
  request.set_mode(mode);
  if (absl::StatusOr<ModeVariant> variant = ParseModeVariant(mode); variant.ok()) {
    request.set_mode(variant->mode);
    if (!variant->format.empty()) {
      request.mutable_response_format()->set_type(variant->format);
      if (variant->format == "json_schema") {
        request.mutable_response_format()->set_schema(kBenchJsonSchema);
      }
    }
  }
  request.set_max_tokens(max_tokens);
  request.mutable_sampling()->set_temperature(0);  // greedy
  return request;
}

TimedStream Generate(v1::Generation::Stub& stub, const std::string& prompt, const std::string& mode,
                     int max_tokens, BenchClock::time_point start, std::chrono::seconds timeout) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  auto reader = stub.Generate(&context, MakeRequest(prompt, mode, max_tokens));
  return ReadTimed(*reader, start);
}

absl::StatusOr<v1::ListModelsResponse> WaitForModels(v1::Generation::Stub& stub,
                                                     const std::string& address,
                                                     absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  for (;;) {
    v1::ListModelsResponse models;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status status = stub.ListModels(&context, {}, &models);
    if (!status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("ListModels at ", address, ": ", DescribeStatus(status)));
    }
    if (models.models_size() > 0) return models;
    if (absl::Now() >= give_up) {
      return absl::UnavailableError(absl::StrCat(address, " serves no model after ",
                                                 absl::FormatDuration(timeout),
                                                 " (no verifier has answered it)"));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

std::vector<double> TimedStream::InterTokenLatencies() const {
  std::vector<double> latencies;
  if (chunks.empty()) return latencies;
  latencies.assign(static_cast<size_t>(chunks.front().tokens - 1), 0.0);
  for (size_t i = 1; i < chunks.size(); ++i) {
    const double per_token = (chunks[i].time - chunks[i - 1].time) / chunks[i].tokens;
    latencies.insert(latencies.end(), static_cast<size_t>(chunks[i].tokens), per_token);
  }
  return latencies;
}

TimedStream ReadTimed(grpc::ClientReaderInterface<v1::GenerateResponse>& reader,
                      BenchClock::time_point start) {
  auto since = [start] { return std::chrono::duration<double>(BenchClock::now() - start).count(); };
  TimedStream result;
  v1::GenerateResponse message;
  while (reader.Read(&message)) {
    const double now = since();
    if (message.token_ids_size() > 0) {
      result.tokens.insert(result.tokens.end(), message.token_ids().begin(),
                           message.token_ids().end());
      result.chunks.push_back({.time = now, .tokens = message.token_ids_size()});
    }
    if (!message.mode().empty()) result.mode = message.mode();
    result.text += message.text();
    if (!message.finish_reason().empty()) {
      result.finish_reason = message.finish_reason();
      result.usage = message.usage();
    }
  }
  result.status = reader.Finish();
  result.end = since();
  return result;
}

double Quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(q * static_cast<double>(values.size()));
  const size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return values[std::min(values.size() - 1, index)];
}

std::string DescribeStatus(const grpc::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", status.error_message());
}

}  // namespace tandem::cli
