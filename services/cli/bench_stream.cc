#include "services/cli/bench_stream.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::cli {

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
