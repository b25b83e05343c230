// The engine tests' fixture: the bundled target behind an engine whose spec drafter is an
// in-process channel (test_draft_channel.h), and each job's single-sequence RunSequence reference.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/engine/bundled_model_test.h"
#include "tests/worker/engine/collecting_sink.h"
#include "tests/worker/engine/test_draft_channel.h"
#include "worker/decoding/runner.h"
#include "worker/decoding/spec.h"
#include "worker/engine/engine.h"

namespace tandem::testing {

inline constexpr int kNewTokens = 24;
inline constexpr int kPrompts = 8;
inline constexpr int kGamma = 3;
inline constexpr char kDrafter[] = "in-process";

struct Job {
  std::string mode;
  int prompt = 0;
  SamplingParams sampling;
};

class EngineTest : public BundledModelTest {
 protected:
  // Channels made by the factory, for inspection; failure applies to channels made later.
  DraftChannelFactory Drafters() {
    return [this](const std::string& address, DraftChannel::ChainCallback on_chain)
               -> absl::StatusOr<std::unique_ptr<DraftChannel>> {
      if (address != kDrafter) return absl::NotFoundError("no such drafter");
      ++channels_made_;
      auto channel = std::make_unique<InProcessDraftChannel>(
          &target(), 512, std::move(on_chain), failure_, chains_before_failure_, hidden_layers_);
      last_channel_ = channel.get();
      return channel;
    };
  }

  std::unique_ptr<Engine> MakeEngine(EngineOptions options) {
    options.default_drafter = kDrafter;
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(model_, std::move(options), Drafters());
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  static ModeOptions Options(const std::string& mode) {
    ModeOptions o;
    o.spec_gamma = kGamma;
    if (mode == "jacobi") o.jacobi_block_size = 4;
    return o;
  }

  SequenceRequest Request(const Job& job, int max_tokens = kNewTokens) {
    SequenceRequest r;
    r.prompt_ids = (*prompts_)[job.prompt];
    r.mode = job.mode;
    r.mode_options = Options(job.mode);
    r.sampling = job.sampling;
    r.max_tokens = max_tokens;
    return r;
  }

  std::set<int32_t> StopTokens() const {
    std::set<int32_t> stop(target().config().eos_token_ids.begin(),
                           target().config().eos_token_ids.end());
    for (const char* name : {"<|im_end|>", "<|endoftext|>"}) {
      if (auto id = model_->tokenizer->TokenId(name)) stop.insert(*id);
    }
    return stop;
  }

  Transformer& target() const { return *model_->model; }

  // The single-sequence reference: RunSequence with the same mode (spec drafting in-process with
  // the target itself) and the engine's stop tokens.
  std::vector<int32_t> Reference(const Job& job, int max_tokens = kNewTokens) {
    const ModelConfig& config = target().config();
    std::unique_ptr<DecodingMode> mode;
    if (job.mode == "spec") {
      mode = std::make_unique<SpecMode>(
          kGamma, std::make_unique<InProcessArDrafter>(&target(), config.max_position_embeddings),
          config.vocab_size, config.max_position_embeddings);
    } else {
      ModeOptions options = Options(job.mode);
      // simsd's output depends on its drafter: the engine's channels draft with the target.
      if (job.mode == "simsd") options.spec_drafter = &target();
      absl::StatusOr<std::unique_ptr<DecodingMode>> created =
          CreateMode(job.mode, options, config, job.sampling);
      EXPECT_TRUE(created.ok()) << created.status();
      if (!created.ok()) return {};
      mode = std::move(*created);
    }
    RunOptions run;
    run.max_tokens = max_tokens;
    run.sampling = job.sampling;
    run.on_token = [stop = StopTokens()](int32_t t) { return stop.count(t) > 0; };
    const std::vector<int32_t>& prompt = (*prompts_)[job.prompt];
    KvCache kv(target().KvOptions(static_cast<int64_t>(prompt.size()) + max_tokens + 512));
    absl::StatusOr<RunStats> r = RunSequence(target(), kv, 1, *mode, prompt, run);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->tokens : std::vector<int32_t>();
  }

  // Submits every job at once and checks each against its reference; returns the sinks. With
  // `each_drafts`, every spec or simsd job must have verified drafts.
  std::vector<std::shared_ptr<CollectingSink>> ExpectMatchesReference(Engine& engine,
                                                                      const std::vector<Job>& jobs,
                                                                      bool each_drafts = true) {
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (const Job& job : jobs) {
      sinks.push_back(std::make_shared<CollectingSink>());
      absl::StatusOr<uint64_t> id = engine.Submit(Request(job), sinks.back());
      EXPECT_TRUE(id.ok()) << id.status();
      if (!id.ok()) return sinks;
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_TRUE(sinks[i]->Wait());
      const std::string label = jobs[i].mode + " prompt " + std::to_string(jobs[i].prompt);
      EXPECT_TRUE(sinks[i]->error().ok()) << label << ": " << sinks[i]->error();
      EXPECT_EQ(sinks[i]->errors(), 0) << label;
      EXPECT_EQ(sinks[i]->after_done(), 0) << label;
      EXPECT_EQ(sinks[i]->tokens(), Reference(jobs[i])) << label;
      EXPECT_NE(sinks[i]->finish(), FinishReason::kCancelled) << label;
      EXPECT_EQ(sinks[i]->usage().completion_tokens, static_cast<int>(sinks[i]->tokens().size()))
          << label;
      if (each_drafts && (jobs[i].mode == "spec" || jobs[i].mode == "simsd")) {
        EXPECT_GT(sinks[i]->usage().drafted, 0) << label;
      }
    }
    return sinks;
  }

  std::vector<Job> Jobs(const std::vector<std::string>& modes, int prompts = kPrompts) {
    std::vector<Job> jobs;
    for (const std::string& mode : modes) {
      for (int p = 0; p < prompts; ++p) jobs.push_back({.mode = mode, .prompt = p});
    }
    return jobs;
  }

  InProcessDraftChannel::Failure failure_ = InProcessDraftChannel::Failure::kNone;
  int chains_before_failure_ = 0;
  int channels_made_ = 0;
  std::vector<int32_t> hidden_layers_;             // what channels made later ask for
  InProcessDraftChannel* last_channel_ = nullptr;  // owned by the engine
};

}  // namespace tandem::testing
