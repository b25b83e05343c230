// CudaTransformer: what a step returns. The rows' sample requests (device sampling and draft
// verification, kernels/cuda/sampling.cuh and verify.cuh) and the downloads of tokens, verdicts
// and logits into each extend's output.
#include <cstdint>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cuda/device.h"
#include "worker/model/cuda/cuda_transformer.h"
#include "worker/model/transformer.h"

namespace tandem {

namespace kcu = kernels::cuda;

CudaTransformer::SampleSpan CudaTransformer::PlanSampleSpan(std::span<const Extend> batch) {
  SampleSpan span;
  int rows = 0;
  for (const Extend& x : batch) {
    const int k = static_cast<int>(x.outputs.size());
    if (!x.samples.empty() && k > 0) {
      if (span.first < 0) span.first = rows;
      span.last = rows + k;
      for (const SampleRequest& q : x.samples) span.verify = span.verify || q.draft >= 0;
    }
    rows += k;
  }
  if (span.first < 0) return span;
  // Default: greedy, no draft, for rows without a request (their results are dropped).
  span.settings.resize(span.last - span.first);
  int row = 0;
  for (const Extend& x : batch) {
    for (size_t i = 0; i < x.samples.size(); ++i) {
      const int r = row + static_cast<int>(i);
      if (r < span.first || r >= span.last) continue;
      const SampleRequest& q = x.samples[i];
      kcu::VerifyRow& v = span.settings[r - span.first];
      kcu::SamplingRow& s = v.sampling;
      s.temperature = q.params.temperature;
      s.top_k = q.params.top_k;
      s.top_p = q.params.top_p;
      s.min_p = q.params.min_p;
      s.seed = q.params.seed;
      s.position = q.position;
      s.purpose = static_cast<uint32_t>(q.purpose);
      // Only sampled rows need a vocabulary-sized workspace row; greedy rows (the kernels'
      // test is the host's, temperature <= 0) take an argmax and none.
      if (!q.params.greedy()) s.workspace_row = span.sampled++;
      v.draft = q.draft;
    }
    row += static_cast<int>(x.outputs.size());
  }
  return span;
}

absl::Status CudaTransformer::LaunchSampling(const SampleSpan& span, const float* logits,
                                             std::vector<int32_t>& tokens,
                                             std::vector<uint8_t>& accepted) {
  const int vocab = model_->config().vocab_size;
  const int rows = span.last - span.first;
  // The sampler's and the verifier's parameters share these fields and buffers; the verifier
  // adds the drafts (in its row settings) and the accepted flags.
  auto launch = [&](auto& p, auto& row_buffer, const auto& row_settings) -> absl::Status {
    p.logits = logits + static_cast<size_t>(span.first) * vocab;
    p.logits_stride = vocab;
    p.rows = rows;
    p.vocab = vocab;
    p.workspace_rows = span.sampled;
    TANDEM_RETURN_IF_ERROR(sampling_.tokens.Reserve(rows));
    TANDEM_RETURN_IF_ERROR(sampling_.workspace.Reserve(kcu::WorkspaceBytes(p)));
    TANDEM_RETURN_IF_ERROR(row_buffer.Reserve(rows));
    TANDEM_RETURN_IF_ERROR(StageUpload(row_buffer, row_settings.data(), row_settings.size()));
    p.rows_params = row_buffer.get();
    p.tokens = sampling_.tokens.get();
    p.workspace = sampling_.workspace.get();
    p.workspace_bytes = sampling_.workspace.bytes();
    return kcu::Invoke(p, stream_);
  };
  if (span.verify) {
    kcu::VerifyParams p;
    TANDEM_RETURN_IF_ERROR(sampling_.accepted.Reserve(rows));
    p.accepted = sampling_.accepted.get();
    TANDEM_RETURN_IF_ERROR(launch(p, sampling_.verify_rows, span.settings));
    accepted.resize(rows);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(accepted.data(), sampling_.accepted.get(),
                                                accepted.size(), cudaMemcpyDeviceToHost, stream_));
  } else {
    std::vector<kcu::SamplingRow> plain(rows);
    for (int r = 0; r < rows; ++r) plain[r] = span.settings[r].sampling;
    kcu::SamplingParams p;
    TANDEM_RETURN_IF_ERROR(launch(p, sampling_.rows, plain));
  }
  tokens.resize(rows);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(tokens.data(), sampling_.tokens.get(),
                                              tokens.size() * sizeof(int32_t),
                                              cudaMemcpyDeviceToHost, stream_));
  return absl::OkStatus();
}

absl::Status CudaTransformer::Collect(std::span<const Extend> batch, const float* logits,
                                      std::vector<ExtendOutput>& outputs) {
  const int vocab = model_->config().vocab_size;
  const SampleSpan span = PlanSampleSpan(batch);
  const int first = span.first;
  const bool verify = span.verify;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> accepted;
  if (first >= 0) {
    TANDEM_RETURN_IF_ERROR(LaunchSampling(span, logits, tokens, accepted));
  }
  // Logits: one download per run of consecutive extends that want them (one copy for a batch
  // that all does, as before sampling existed); a lone extend's rows land in its output
  // directly, a longer run's in `staged`, split after the wait.
  struct Run {
    size_t first_extend = 0, end_extend = 0;
    int first_row = 0, rows = 0;
  };
  std::vector<Run> runs;
  int row = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const int k = static_cast<int>(batch[e].outputs.size());
    if (batch[e].return_logits && k > 0) {
      if (!runs.empty() && runs.back().end_extend == e &&
          runs.back().first_row + runs.back().rows == row) {
        runs.back().end_extend = e + 1;
        runs.back().rows += k;
      } else {
        runs.push_back({e, e + 1, row, k});
      }
    }
    row += k;
  }
  std::vector<std::vector<float>> staged(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    std::vector<float>& dst =
        r.end_extend - r.first_extend == 1 ? outputs[r.first_extend].logits : staged[i];
    dst.resize(static_cast<size_t>(r.rows) * vocab);
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst.data(), logits + static_cast<size_t>(r.first_row) * vocab,
                        dst.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  // Every copy of this step has completed: the staging arena is free for the next.
  staging_in_flight_ = false;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (staged[i].empty()) continue;
    size_t offset = 0;
    for (size_t e = runs[i].first_extend; e < runs[i].end_extend; ++e) {
      const size_t values = batch[e].outputs.size() * static_cast<size_t>(vocab);
      outputs[e].logits.assign(staged[i].begin() + offset, staged[i].begin() + offset + values);
      offset += values;
    }
  }
  row = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const Extend& x = batch[e];
    if (!x.samples.empty()) {
      const int k = static_cast<int>(x.outputs.size());
      outputs[e].tokens.assign(tokens.begin() + (row - first), tokens.begin() + (row - first) + k);
      if (verify) {
        outputs[e].accepted.assign(accepted.begin() + (row - first),
                                   accepted.begin() + (row - first) + k);
      } else {
        outputs[e].accepted.assign(k, 1);
      }
    }
    row += static_cast<int>(x.outputs.size());
  }
  return absl::OkStatus();
}

}  // namespace tandem
