#include "tests/integration/cluster.h"

#include <chrono>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tandem::testing {

namespace {

constexpr absl::Duration kStartTimeout = absl::Seconds(120);

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> StartService(const std::string& name,
                                                           std::vector<std::string> argv,
                                                           std::string* address) {
  // Test services share the machine's cores with each other and with other tests.
  auto child =
      ChildProcess::Start({.name = name, .argv = std::move(argv), .default_env = SharedCoresEnv()});
  if (!child.ok()) return child.status();
  auto announced = (*child)->WaitForAddress(kStartTimeout);
  if (!announced.ok()) return announced.status();
  *address = *announced;
  return std::move(*child);
}

std::string TargetModelDir() { return std::string(TANDEM_SOURCE_DIR) + "/models/tandem-target"; }

std::string BinaryPath(const std::string& folder, const std::string& name) {
  const char* env = std::getenv("TANDEM_BINARY_DIR");
  const std::string root = env != nullptr && *env != '\0' ? env : TANDEM_BINARY_DIR;
  return absl::StrCat(root, "/services/", folder, "/", name);
}

std::unique_ptr<v1::Generation::Stub> GenerationStub(const std::string& address) {
  return v1::Generation::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(ClusterOptions options) {
  std::unique_ptr<Cluster> cluster(new Cluster());
  const std::string model = TargetModelDir();
  std::vector<std::string> verifier = {BinaryPath("verifier", "tandem-verifier"), "--model", model,
                                       "--listen", "127.0.0.1:0"};
  std::vector<std::string> router = {BinaryPath("router", "tandem-router"), "--listen",
                                     "127.0.0.1:0"};
  std::vector<std::string> drafter = {BinaryPath("drafter", "tandem-drafter"), "--listen",
                                      "127.0.0.1:0"};
  if (options.drafter_model_flags.empty()) {
    drafter.insert(drafter.end(), {"--model", model});
  } else {
    drafter.insert(drafter.end(), options.drafter_model_flags.begin(),
                   options.drafter_model_flags.end());
  }
  if (options.metrics) {
    for (auto* argv : {&verifier, &router, &drafter}) {
      argv->insert(argv->end(), {"--metrics-listen", "127.0.0.1:0"});
    }
  }
  if (!options.cluster_token_file.empty()) {
    for (auto* argv : {&verifier, &router, &drafter}) {
      argv->insert(argv->end(), {"--cluster-token-file", options.cluster_token_file});
    }
  }
  if (options.drafter) {
    auto drafter_process = StartService("drafter", drafter, &cluster->drafter_address_);
    if (!drafter_process.ok()) return drafter_process.status();
    cluster->drafter_ = std::move(*drafter_process);
    verifier.insert(verifier.end(), {"--drafter", cluster->drafter_address_});
    router.insert(router.end(), {"--drafter", cluster->drafter_address_});
  }
  verifier.insert(verifier.end(), options.verifier_flags.begin(), options.verifier_flags.end());
  auto verifier_process = StartService("verifier", verifier, &cluster->verifier_address_);
  if (!verifier_process.ok()) return verifier_process.status();
  cluster->verifier_ = std::move(*verifier_process);
  router.insert(router.end(), {"--verifier", cluster->verifier_address_});
  if (options.router_max_queue > 0) {
    router.insert(router.end(), {"--max-queue", std::to_string(options.router_max_queue)});
  }
  router.insert(router.end(), options.router_flags.begin(), options.router_flags.end());
  auto router_process = StartService("router", router, &cluster->router_address_);
  if (!router_process.ok()) return router_process.status();
  cluster->router_ = std::move(*router_process);
  cluster->generation_ = GenerationStub(cluster->router_address_);
  return cluster;
}

absl::StatusOr<std::string> Cluster::StartExtraRouter(std::vector<std::string> extra_flags) {
  std::vector<std::string> argv = {BinaryPath("router", "tandem-router"), "--listen", "127.0.0.1:0",
                                   "--verifier", verifier_address_};
  if (!drafter_address_.empty()) argv.insert(argv.end(), {"--drafter", drafter_address_});
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  std::string address;
  auto router = StartService("router", argv, &address);
  if (!router.ok()) return router.status();
  extra_routers_.push_back(std::move(*router));
  return address;
}

v1::GenerateRequest Greedy(const std::string& prompt, const std::string& mode, int max_tokens) {
  v1::GenerateRequest request;
  request.set_prompt(prompt);
  request.set_mode(mode);
  request.set_max_tokens(max_tokens);
  return request;
}

StreamResult Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                      absl::Duration timeout,
                      const std::function<void(const v1::GenerateResponse&)>& on_message) {
  StreamResult result;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(timeout));
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse message;
  while (reader->Read(&message)) {
    ++result.messages;
    result.tokens.insert(result.tokens.end(), message.token_ids().begin(),
                         message.token_ids().end());
    result.text += message.text();
    if (!message.finish_reason().empty()) result.last = message;
    if (on_message) on_message(message);
  }
  result.status = reader->Finish();
  return result;
}

}  // namespace tandem::testing
