// The cluster as separate processes (tandem-drafter, tandem-verifier, tandem-router on loopback
// ports chosen by the OS), driven through the router's public Generation API: exact greedy output
// in every mode against the in-process generator, a drafter killed mid-generation, bad input,
// admission, deadlines and the `tandem up` command.
#include "tests/integration/cluster.h"

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "services/cli/child_process.h"
#include "tandem/v1/drafter.grpc.pb.h"
#include "tandem/v1/verifier.grpc.pb.h"
#include "tests/support/health_check.h"
#include "worker/decoding/modes.h"
#include "worker/engine/local_generator.h"

namespace tandem::testing {
namespace {

const std::vector<std::string> kPrompts = {"def fibonacci(n):", "import os\n",
                                           "class Stack:\n    def push(self, x):"};

// The in-process generator on the same model: what every greedy request must reproduce.
class Reference {
 public:
  static Reference& Get() {
    static Reference* reference = new Reference();
    return *reference;
  }

  // Greedy completion tokens of `prompt` in `mode`.
  absl::StatusOr<GenerateResult> Generate(const std::string& prompt, const std::string& mode,
                                          int max_tokens, const ModeOptions& mode_options = {}) {
    if (!model_.ok()) return model_.status();
    LocalGenerator generator(&*model_);
    GenerateOptions options;
    options.mode = mode;
    options.max_tokens = max_tokens;
    options.mode_options = mode_options;
    // The cluster's drafter serves the target model itself; simsd's output depends on it.
    if (mode == "spec" || mode == "simsd") options.drafter = &*model_;
    return generator.Generate(prompt, options);
  }

 private:
  Reference() : model_(LoadModelDir(TargetModelDir())) {}
  absl::StatusOr<LoadedModel> model_;
};

// One cluster for the tests that do not break it.
class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto cluster = Cluster::Start();
    if (!cluster.ok()) {
      start_error_ = new std::string(cluster.status().ToString());
      return;
    }
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(cluster_, nullptr) << "the cluster did not start: " << *start_error_;
  }

  static Cluster* cluster_;
  static std::string* start_error_;
};

Cluster* ClusterTest::cluster_ = nullptr;
std::string* ClusterTest::start_error_ = nullptr;

TEST_F(ClusterTest, GreedyOutputEqualsInProcessInEveryMode) {
  for (const std::string& mode : ImplementedModes()) {
    for (const std::string& prompt : kPrompts) {
      SCOPED_TRACE("mode " + mode + ", prompt '" + prompt + "'");
      auto expected = Reference::Get().Generate(prompt, mode, 48);
      ASSERT_TRUE(expected.ok()) << expected.status();
      StreamResult got = Generate(cluster_->generation(), Greedy(prompt, mode, 48));
      ASSERT_TRUE(got.status.ok()) << got.status.error_message();
      EXPECT_EQ(got.tokens, expected->tokens);
      EXPECT_EQ(got.text, expected->text);
      EXPECT_EQ(got.last.finish_reason(), FinishReasonName(expected->finish));
      EXPECT_EQ(got.last.mode(), mode);
      EXPECT_EQ(got.last.usage().completion_tokens(), static_cast<int>(got.tokens.size()));
    }
  }
}

// Mode options the verifier API carries are honoured: each request equals the in-process
// generator given the same options, and differs from the mode's defaults where they matter.
TEST_F(ClusterTest, VerifierHonoursNspIsdSimsdAndDiffusionOptions) {
  auto channel =
      grpc::CreateChannel(cluster_->verifier_address(), grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::Verifier::Stub> verifier = v1::Verifier::NewStub(channel);
  struct Case {
    std::string mode;
    v1::ModeOptions wire;
    ModeOptions local;
  };
  std::vector<Case> cases(6);
  cases[0].mode = "nsp";
  cases[0].wire.set_nsp_tau(0.5f);
  cases[0].local.nsp_tau = 0.5f;
  cases[1].mode = "nsp";
  cases[1].wire.set_nsp_confidence("entropy");
  cases[1].wire.set_nsp_block(4);
  cases[1].local.nsp_confidence = "entropy";
  cases[1].local.nsp_block = 4;
  cases[2].mode = "isd";
  cases[2].wire.set_isd_stride(3);
  cases[2].local.isd_stride = 3;
  // simsd through the drafter service equals the in-process decode at γ = the block size (8);
  // with γ < B mid-block drafts depend on the drafter's chains (docs/MODES.md).
  cases[3].mode = "simsd";
  cases[3].wire.set_simsd_gamma(8);
  cases[3].local.simsd_gamma = 8;
  // diffusion by the bundled target's trained sampler (models/tandem-target/sampler).
  cases[4].mode = "diffusion";
  cases[4].wire.set_diffusion_sampler(0.5f);
  cases[4].local.diffusion_sampler = 0.5f;
  // nsp's quadratic variant (lossless: the response says so).
  cases[5].mode = "nsp";
  cases[5].wire.set_nsp_quadratic(true);
  cases[5].local.nsp_quadratic = true;
  for (const Case& c : cases) {
    for (const std::string& prompt : kPrompts) {
      SCOPED_TRACE("mode " + c.mode + " " + c.wire.ShortDebugString() + ", prompt '" + prompt +
                   "'");
      auto expected = Reference::Get().Generate(prompt, c.mode, 48, c.local);
      ASSERT_TRUE(expected.ok()) << expected.status();
      v1::VerifyRequest request;
      *request.mutable_request() = Greedy(prompt, c.mode, 48);
      *request.mutable_mode_options() = c.wire;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
      std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
          verifier->Generate(&context, request);
      std::vector<int32_t> tokens;
      v1::GenerateResponse message;
      v1::GenerateResponse last;
      while (reader->Read(&message)) {
        tokens.insert(tokens.end(), message.token_ids().begin(), message.token_ids().end());
        last = message;
      }
      const grpc::Status status = reader->Finish();
      ASSERT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(tokens, expected->tokens);
      EXPECT_EQ(last.mode(), c.mode);
      EXPECT_EQ(last.lossy(), !expected->lossless);
    }
  }
  // nsp at tau 0.5 is not nsp at its default 0.9 on every prompt: the option changed the decode.
  bool differs = false;
  for (const std::string& prompt : kPrompts) {
    auto at_default = Reference::Get().Generate(prompt, "nsp", 48);
    auto at_half = Reference::Get().Generate(prompt, "nsp", 48, cases[0].local);
    ASSERT_TRUE(at_default.ok() && at_half.ok());
    differs = differs || at_default->tokens != at_half->tokens ||
              at_default->forwards != at_half->forwards;
  }
  EXPECT_TRUE(differs);

  // A bad value is INVALID_ARGUMENT naming the field: refused by the conversion (nsp_tau) or
  // by the mode the option reached (simsd_gamma above the block size).
  for (const auto& [mode, field] : std::vector<std::pair<std::string, std::string>>{
           {"nsp", "nsp_tau"}, {"simsd", "simsd_gamma"}, {"diffusion", "diffusion_sampler"}}) {
    v1::VerifyRequest bad;
    *bad.mutable_request() = Greedy("def f(", mode, 8);
    if (mode == "nsp") bad.mutable_mode_options()->set_nsp_tau(2.0f);
    if (mode == "simsd") bad.mutable_mode_options()->set_simsd_gamma(9);
    if (mode == "diffusion") bad.mutable_mode_options()->set_diffusion_sampler(1.5f);
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        verifier->Generate(&context, bad);
    v1::GenerateResponse message;
    while (reader->Read(&message)) {
    }
    const grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_NE(status.error_message().find(field), std::string::npos) << status.error_message();
  }
}

TEST_F(ClusterTest, ListModelsNamesTheBundledModel) {
  grpc::ClientContext context;
  v1::ListModelsResponse models;
  ASSERT_TRUE(cluster_->generation().ListModels(&context, v1::ListModelsRequest(), &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).id(), "tandem-target");
  EXPECT_EQ(models.models(0).max_context(), 512);
  // No chat template: the ChatML prompt lists tools the Hermes way.
  EXPECT_EQ(models.models(0).tool_call_syntax(), "hermes");
  for (const std::string& mode : ImplementedModes()) {
    EXPECT_NE(std::find(models.models(0).modes().begin(), models.models(0).modes().end(), mode),
              models.models(0).modes().end())
        << mode;
  }
}

TEST_F(ClusterTest, BadInputIsInvalidArgumentAndTheNextRequestSucceeds) {
  std::map<std::string, v1::GenerateRequest> cases;
  const v1::GenerateRequest good = Greedy("def f(x):", "ar", 8);
  cases["no input"] = good;
  cases["no input"].clear_input();
  cases["empty prompt"] = good;
  cases["empty prompt"].set_prompt("");
  cases["empty chat"] = good;
  cases["empty chat"].mutable_chat();
  cases["empty token ids"] = good;
  cases["empty token ids"].mutable_token_ids();
  cases["unknown model"] = good;
  cases["unknown model"].set_model("no-such-model");
  cases["unknown mode"] = good;
  cases["unknown mode"].set_mode("warp");
  cases["zero max_tokens"] = good;
  cases["zero max_tokens"].set_max_tokens(0);
  cases["negative max_tokens"] = good;
  cases["negative max_tokens"].set_max_tokens(-3);
  cases["max_tokens = context"] = good;
  cases["max_tokens = context"].set_max_tokens(512);
  cases["negative temperature"] = good;
  cases["negative temperature"].mutable_sampling()->set_temperature(-0.5f);
  cases["top_k below -1"] = good;  // -1 is off, as over HTTP
  cases["top_k below -1"].mutable_sampling()->set_top_k(-2);
  cases["negative stop token id"] = good;
  cases["negative stop token id"].add_stop_token_ids(-1);
  cases["stop token id past the vocabulary"] = good;
  cases["stop token id past the vocabulary"].add_stop_token_ids(1 << 30);
  cases["infinite temperature"] = good;
  cases["infinite temperature"].mutable_sampling()->set_temperature(
      std::numeric_limits<float>::infinity());
  cases["top_p above 1"] = good;
  cases["top_p above 1"].mutable_sampling()->set_top_p(1.5f);
  cases["negative top_p"] = good;
  cases["negative top_p"].mutable_sampling()->set_top_p(-0.1f);
  cases["invalid UTF-8 prompt"] = good;
  cases["invalid UTF-8 prompt"].set_prompt("def \xff\xfe(x):");
  cases["invalid UTF-8 chat"] = good;
  auto* turn = cases["invalid UTF-8 chat"].mutable_chat()->add_messages();
  turn->set_role("user");
  turn->set_content("caf\xc3(");
  cases["5 MiB prompt"] = good;
  cases["5 MiB prompt"].set_prompt(std::string(5 << 20, 'a'));

  for (const auto& [name, request] : cases) {
    SCOPED_TRACE(name);
    StreamResult bad = Generate(cluster_->generation(), request);
    EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << bad.status.error_message();
    EXPECT_FALSE(bad.status.error_message().empty());
    EXPECT_EQ(bad.messages, 0);
    StreamResult next = Generate(cluster_->generation(), good);
    EXPECT_TRUE(next.status.ok()) << next.status.error_message();
    EXPECT_FALSE(next.tokens.empty());
  }
}

TEST_F(ClusterTest, MessagesNameTheFieldAtFault) {
  v1::GenerateRequest request = Greedy("def f(x):", "warp", 8);
  StreamResult result = Generate(cluster_->generation(), request);
  EXPECT_NE(result.status.error_message().find("unknown mode 'warp'"), std::string::npos)
      << result.status.error_message();
  request = Greedy("def f(x):", "ar", 8);
  request.mutable_chat()->add_messages()->set_content("\xff");
  result = Generate(cluster_->generation(), request);
  EXPECT_NE(result.status.error_message().find("chat.messages[0].content"), std::string::npos)
      << result.status.error_message();
}

// Bytes sent straight to a service's streaming method, as a client with another (or a broken)
// schema would: the call's status.
grpc::Status CallRaw(const std::string& address, const std::string& method,
                     const std::string& bytes) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::CompletionQueue queue;
  auto call = stub.PrepareCall(&context, method, &queue);
  auto step = [&queue](std::function<void(void*)> start) {
    void* tag = nullptr;
    bool ok = false;
    start(reinterpret_cast<void*>(1));
    queue.Next(&tag, &ok);
    return ok;
  };
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  step([&](void* tag) { call->StartCall(tag); });
  step([&](void* tag) { call->Write(request, tag); });
  step([&](void* tag) { call->WritesDone(tag); });
  while (step([&](void* tag) { call->Read(&response, tag); })) {
  }
  step([&](void* tag) { call->Finish(&status, tag); });
  queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue.Next(&tag, &ok)) {
  }
  return status;
}

TEST_F(ClusterTest, MalformedBytesToTheVerifierAreInvalidArgumentWithTheReason) {
  const grpc::Status garbage =
      CallRaw(cluster_->verifier_address(), "/tandem.v1.Verifier/Generate", "\xff\xff\xff\x07");
  EXPECT_EQ(garbage.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << garbage.error_message();
  EXPECT_NE(garbage.error_message().find("not a valid tandem.v1.VerifyRequest"), std::string::npos)
      << garbage.error_message();
  // request (field 1) holding prompt (field 2) "\xff": a proto3 string that is not UTF-8.
  const grpc::Status utf8 = CallRaw(cluster_->verifier_address(), "/tandem.v1.Verifier/Generate",
                                    std::string("\x0a\x03\x12\x01\xff", 5));
  EXPECT_EQ(utf8.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << utf8.error_message();
  EXPECT_NE(utf8.error_message().find("request.prompt is not valid UTF-8"), std::string::npos)
      << utf8.error_message();
  // The verifier serves on.
  StreamResult after = Generate(cluster_->generation(), Greedy("def f(x):", "ar", 4));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
}

TEST_F(ClusterTest, ExpiredDeadlineIsDeadlineExceeded) {
  StreamResult result =
      Generate(cluster_->generation(), Greedy("def f(x):", "ar", 400), absl::Milliseconds(1));
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << result.status.error_message();
}

TEST_F(ClusterTest, BeyondMaxQueueIsResourceExhausted) {
  auto router = cluster_->StartExtraRouter({"--max-queue", "1"});
  ASSERT_TRUE(router.ok()) << router.status();
  auto stub = GenerationStub(*router);
  // The first stream holds the only slot: the client reads its first message, then waits
  // until the second request has been answered before it reads on.
  absl::Notification first_message;
  absl::Notification second_answered;
  StreamResult first;
  std::thread holder([&] {
    first = Generate(*stub, Greedy("def fibonacci(n):", "ar", 200), absl::Seconds(300),
                     [&](const v1::GenerateResponse&) {
                       if (!first_message.HasBeenNotified()) {
                         first_message.Notify();
                         second_answered.WaitForNotification();
                       }
                     });
  });
  first_message.WaitForNotification();
  StreamResult second = Generate(*stub, Greedy("import os\n", "ar", 8));
  second_answered.Notify();
  holder.join();
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << second.status.error_message();
  EXPECT_NE(second.status.error_message().find("router is at capacity (1 requests in flight)"),
            std::string::npos)
      << second.status.error_message();
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
  StreamResult third = Generate(*stub, Greedy("import os\n", "ar", 8));
  EXPECT_TRUE(third.status.ok()) << third.status.error_message();
}

// A drafter that dies under load costs speed, never correctness: every `spec` stream completes
// with the exact greedy AR output.
TEST(DrafterFailureTest, KilledDrafterMidGenerationStreamsStillCompleteExactly) {
  // Steps wait for drafts (a dead drafter is not waited for): on a loaded machine late drafts
  // would otherwise make every step before the kill an AR step, and the kill prove nothing.
  auto started = Cluster::Start({.verifier_flags = {"--draft-timeout-ms", "5000"}});
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<Cluster> cluster = std::move(*started);
  constexpr int kStreams = 4;
  constexpr int kMaxTokens = 300;
  std::vector<StreamResult> results(kStreams);
  absl::BlockingCounter streaming(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      int received = 0;
      bool counted = false;
      results[i] =
          Generate(cluster->generation(), Greedy(kPrompts[i % kPrompts.size()], "spec", kMaxTokens),
                   absl::Seconds(300), [&](const v1::GenerateResponse& message) {
                     received += message.token_ids_size();
                     // Past the first few steps, drafts are flowing; a stream that ends sooner
                     // counts too.
                     if (!counted && (received >= 32 || !message.finish_reason().empty())) {
                       counted = true;
                       streaming.DecrementCount();
                     }
                   });
    });
  }
  // Every stream has started decoding with drafts; the drafter dies now.
  streaming.Wait();
  cluster->drafter()->Signal(SIGKILL);
  EXPECT_TRUE(cluster->drafter()->WaitForExit(absl::Seconds(10)).has_value());
  for (std::thread& client : clients) client.join();
  int drafted = 0;
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE("stream " + std::to_string(i));
    const std::string& prompt = kPrompts[i % kPrompts.size()];
    auto expected = Reference::Get().Generate(prompt, "ar", kMaxTokens);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, expected->tokens);
    EXPECT_EQ(results[i].text, expected->text);
    drafted += results[i].last.usage().draft_tokens();
  }
  EXPECT_GT(drafted, 0) << "the drafter was never used, so its death proved nothing";
}

// With a cluster token the services answer only each other: a spec request through the router
// drafts (router -> verifier -> drafter all carry the token), while a call straight to the
// verifier or the drafter without it is UNAUTHENTICATED; health stays open for probes.
TEST(ClusterTokenTest, ServicesAnswerOnlyCallsThatCarryTheToken) {
  const std::string token_file = ::testing::TempDir() + "cluster-token-" + std::to_string(getpid());
  {
    std::ofstream out(token_file);
    out << "s3cret-token\n";
  }
  auto started = Cluster::Start({.cluster_token_file = token_file});
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<Cluster> cluster = std::move(*started);
  auto expected = Reference::Get().Generate(kPrompts[0], "ar", 48);
  ASSERT_TRUE(expected.ok()) << expected.status();
  // On a loaded machine the verifier's first session may open before its drafter connection is
  // up (those steps decode AR, as they should): a few requests, one of which must draft.
  int drafted = 0;
  for (int attempt = 0; attempt < 3 && drafted == 0; ++attempt) {
    StreamResult through = Generate(cluster->generation(), Greedy(kPrompts[0], "spec", 48));
    ASSERT_TRUE(through.status.ok()) << through.status.error_message();
    EXPECT_EQ(through.tokens, expected->tokens);
    drafted = through.last.usage().draft_tokens();
  }
  EXPECT_GT(drafted, 0) << "the verifier could not reach the drafter";

  auto channel = [](const std::string& address) {
    return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  };
  auto verifier = v1::Verifier::NewStub(channel(cluster->verifier_address()));
  auto drafter = v1::Drafter::NewStub(channel(cluster->drafter_address()));
  for (const char* authorization : {"", "Bearer wrong-token"}) {
    SCOPED_TRACE(authorization);
    auto with = [&](grpc::ClientContext& context) {
      if (*authorization != '\0') context.AddMetadata("authorization", authorization);
    };
    {
      grpc::ClientContext context;
      with(context);
      v1::WorkerLoad load;
      EXPECT_EQ(verifier->GetLoad(&context, v1::WorkerLoadRequest(), &load).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
    {
      grpc::ClientContext context;
      with(context);
      v1::VerifyRequest request;
      *request.mutable_request() = Greedy(kPrompts[0], "ar", 4);
      auto reader = verifier->Generate(&context, request);
      v1::GenerateResponse message;
      EXPECT_FALSE(reader->Read(&message));
      EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
    {
      grpc::ClientContext context;
      with(context);
      v1::WorkerInfo info;
      EXPECT_EQ(drafter->GetInfo(&context, v1::WorkerInfoRequest(), &info).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
    {
      grpc::ClientContext context;
      with(context);
      auto stream = drafter->Draft(&context);
      v1::DraftChain chain;
      EXPECT_FALSE(stream->Read(&chain));
      EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer s3cret-token");
    v1::WorkerLoad load;
    EXPECT_TRUE(verifier->GetLoad(&context, v1::WorkerLoadRequest(), &load).ok());
  }
  for (const std::string& address : {cluster->verifier_address(), cluster->drafter_address()}) {
    bool serving = false;
    EXPECT_TRUE(CheckHealth(channel(address), &serving).ok()) << address;
    EXPECT_TRUE(serving) << address;
  }
  std::remove(token_file.c_str());
}

TEST(TandemUpTest, ServesOneRequestAndStopsOnSigterm) {
  auto up =
      ChildProcess::Start({.name = "tandem up",
                           .argv = {BinaryPath("cli", "tandem"), "up", "--listen", "127.0.0.1:0"}});
  ASSERT_TRUE(up.ok()) << up.status();
  auto address = (*up)->WaitForAddress(absl::Seconds(180));
  ASSERT_TRUE(address.ok()) << address.status();
  auto stub = GenerationStub(*address);
  StreamResult result = Generate(*stub, Greedy("def fibonacci(n):", "ar", 16));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  auto expected = Reference::Get().Generate("def fibonacci(n):", "ar", 16);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(result.tokens, expected->tokens);
  (*up)->Signal(SIGTERM);
  std::optional<int> status = (*up)->WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << "tandem up did not stop within 60 s";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << ChildProcess::DescribeExit(*status) << "\n"
      << (*up)->StderrTail();
}

// The bundled target's pcLLM adapter folder.
std::string PcllmAdapter() { return TargetModelDir() + "/pcllm-lora"; }

// Greedy AR output of the bundled target with `adapter` merged in, in-process (the same merge a
// service's --merge-lora makes).
absl::StatusOr<GenerateResult> MergedGreedy(const std::string& adapter, const std::string& prompt,
                                            int max_tokens) {
  absl::StatusOr<LoadedModel> merged = LoadModelDir(TargetModelDir(), {}, adapter);
  if (!merged.ok()) return merged.status();
  LocalGenerator generator(&*merged);
  GenerateOptions options;
  options.max_tokens = max_tokens;
  return generator.Generate(prompt, options);
}

// --merge-lora reaches the verifier: jacobi through the router reproduces the AR output of the
// target with the pcLLM adapter merged in (in-process, the same merge), not the target's own.
TEST(TandemUpTest, MergeLoraServesTheAdaptedModel) {
  const std::string adapter = PcllmAdapter();
  if (!std::filesystem::exists(adapter + "/adapter_config.json")) {
    GTEST_SKIP() << "no adapter at " << adapter;
  }
  auto expected = MergedGreedy(adapter, kPrompts[0], 24);
  ASSERT_TRUE(expected.ok()) << expected.status();
  auto base = Reference::Get().Generate(kPrompts[0], "ar", 24);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_NE(expected->tokens, base->tokens)
      << "the adapter leaves this prompt's greedy output as it was: the test would prove nothing";

  // With --self-spec-drafter the drafter hosts the target too, adapter merged alike.
  auto up =
      ChildProcess::Start({.name = "tandem up",
                           .argv = {BinaryPath("cli", "tandem"), "up", "--listen", "127.0.0.1:0",
                                    "--merge-lora", adapter, "--self-spec-drafter"}});
  ASSERT_TRUE(up.ok()) << up.status();
  auto address = (*up)->WaitForAddress(absl::Seconds(180));
  ASSERT_TRUE(address.ok()) << address.status();
  auto stub = GenerationStub(*address);
  grpc::ClientContext context;
  v1::ListModelsResponse models;
  ASSERT_TRUE(stub->ListModels(&context, v1::ListModelsRequest(), &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).id(), "tandem-target+pcllm-lora");  // not the plain target's name
  for (const char* mode : {"ar", "jacobi", "spec"}) {
    StreamResult result = Generate(*stub, Greedy(kPrompts[0], mode, 24));
    ASSERT_TRUE(result.status.ok()) << mode << ": " << result.status.error_message();
    EXPECT_EQ(result.tokens, expected->tokens) << mode;
  }
  (*up)->Signal(SIGTERM);
  std::optional<int> status = (*up)->WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << "tandem up did not stop within 60 s";
}

// A drafter given the verifier's --merge-lora hosts the same adapted model under the same name
// (<model>+<adapter folder>): split self-speculation drafts for the model the verifier serves.
TEST(MergedAdapterTest, ASelfSpecDrafterHostsTheVerifiersModel) {
  const std::string adapter = PcllmAdapter();
  if (!std::filesystem::exists(adapter + "/adapter_config.json")) {
    GTEST_SKIP() << "no adapter at " << adapter;
  }
  auto expected = MergedGreedy(adapter, kPrompts[1], 32);
  ASSERT_TRUE(expected.ok()) << expected.status();

  auto cluster =
      Cluster::Start({.verifier_flags = {"--merge-lora", adapter},
                      .drafter_model_flags = {"--model", TargetModelDir(), "--mask-drafts", "4",
                                              "--merge-lora", adapter}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto drafter = v1::Drafter::NewStub(
      grpc::CreateChannel((*cluster)->drafter_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::WorkerInfo info;
  ASSERT_TRUE(drafter->GetInfo(&context, v1::WorkerInfoRequest(), &info).ok());
  EXPECT_EQ(info.model(), "tandem-target+pcllm-lora");
  StreamResult result = Generate((*cluster)->generation(), Greedy(kPrompts[1], "spec", 32));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.tokens, expected->tokens);
}

// The pids of `pid`'s children, in the order they were started.
std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> children;
  pid_t child;
  while (in >> child) children.push_back(child);
  return children;
}

TEST(TandemUpTest, SaysWhichServiceDiedAndExitsNonZero) {
  auto up =
      ChildProcess::Start({.name = "tandem up",
                           .argv = {BinaryPath("cli", "tandem"), "up", "--listen", "127.0.0.1:0"}});
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE((*up)->WaitForAddress(absl::Seconds(180)).ok());
  const std::vector<pid_t> services = ChildrenOf((*up)->pid());
  ASSERT_EQ(services.size(), 3u) << "drafter, verifier, router";
  ASSERT_EQ(kill(services[1], SIGKILL), 0);
  std::optional<int> status = (*up)->WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << "tandem up did not stop after its verifier died";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1)
      << ChildProcess::DescribeExit(*status);
  EXPECT_NE((*up)->StderrTail().find("tandem up: the verifier (pid " + std::to_string(services[1]) +
                                     ") was killed by signal 9"),
            std::string::npos)
      << (*up)->StderrTail();
  for (pid_t service : services) {
    EXPECT_NE(kill(service, 0), 0) << "service " << service << " outlived tandem up";
  }
}

}  // namespace
}  // namespace tandem::testing
