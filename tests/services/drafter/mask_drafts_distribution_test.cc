// Split self-speculation is lossless in distribution: `spec` drafting from a DraftEngine with
// mask drafts on the target itself (the drafter service's engine, reached here without gRPC)
// samples the first three tokens with the target's exact AR distribution, by the chi-square
// check of spec_distribution_test.cc (20k seeded runs, a random-weight target over 12 tokens
// whose last id serves as <|mask|>).
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/services/drafter/chain_collector.h"
#include "tests/worker/decoding/spec_distribution.h"
#include "worker/decoding/drafter.h"
#include "worker/decoding/spec.h"
#include "worker/engine/draft_engine.h"

namespace tandem {
namespace {

using testing::ChainCollector;
using testing::spec_distribution::ExactJoint;
using testing::spec_distribution::Fits;
using testing::spec_distribution::kContext;
using testing::spec_distribution::kVocab;
using testing::spec_distribution::Model;
using testing::spec_distribution::Sampled;
using testing::spec_distribution::SampleJoint;
using testing::spec_distribution::Temperature;

// A Drafter over a DraftEngine: each Draft opens a session with the tokens and waits for its
// chain (as a verifier's ChainDrafter reads a drafter service's chains).
class DraftEngineDrafter final : public Drafter {
 public:
  explicit DraftEngineDrafter(DraftEngine* engine)
      : engine_(engine), stream_(engine->AddStream(chains_.Callback())) {}

  absl::StatusOr<std::vector<int32_t>> Draft(std::span<const int32_t> tokens, int gamma) override {
    ++stats_.calls;
    const uint64_t session = next_session_++;
    engine_->Open(stream_, session, std::vector<int32_t>(tokens.begin(), tokens.end()), gamma);
    std::optional<std::vector<int32_t>> chain =
        chains_.WaitCovered(session, static_cast<int>(tokens.size()), gamma);
    engine_->Close(stream_, session);
    if (!chain.has_value()) return absl::UnavailableError("no chain from the draft engine");
    return *chain;
  }
  const DrafterStats& stats() const override { return stats_; }

 private:
  DraftEngine* engine_;
  ChainCollector chains_;
  uint64_t stream_;
  uint64_t next_session_ = 1;
  DrafterStats stats_;
};

TEST(MaskDraftsDistributionTest, SplitSelfSpecSamplesTheTargetsDistribution) {
  std::unique_ptr<Transformer> target = Model(101, 0.25f, kVocab - 1);
  auto engine = DraftEngine::Create(target.get(), {.kv_tokens = 4096, .mask_drafts = 3});
  ASSERT_TRUE(engine.ok()) << engine.status();
  const SamplingParams sampling = Temperature(1.0f);
  SpecMode spec(2, std::make_unique<DraftEngineDrafter>(engine->get()), kVocab, kContext);
  const Sampled s = SampleJoint(*target, spec, sampling);
  EXPECT_TRUE(Fits(s, ExactJoint(*target, sampling), "split self-spec, mask drafts 3, gamma 2"));
  // Both the accept and the resample branches of verification ran.
  EXPECT_GT(s.accepted, 0);
  EXPECT_LT(s.accepted, s.drafted);
}

}  // namespace
}  // namespace tandem
