#include "services/router/verifier_stubs.h"

#include <cstdio>
#include <utility>

namespace tandem {

VerifierStubs::VerifierStubs(const router::VerifierPool* pool, ChannelFactory factory)
    : pool_(pool), factory_(std::move(factory)) {}

VerifierStubs::VerifierStubs(std::vector<v1::Verifier::Stub*> fixed)
    : stubs_(std::move(fixed)), failed_(stubs_.size(), false) {}

v1::Verifier::Stub* VerifierStubs::Get(size_t index) {
  absl::MutexLock lock(&mu_);
  if (index < stubs_.size() && stubs_[index] != nullptr) return stubs_[index];
  if (pool_ == nullptr || !factory_) return nullptr;
  if (index >= stubs_.size()) {
    stubs_.resize(index + 1, nullptr);
    failed_.resize(index + 1, false);
  }
  if (failed_[index]) return nullptr;
  const std::string address = pool_->address(index);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = factory_(address);
  if (!channel.ok()) {
    failed_[index] = true;
    std::fprintf(stderr, "tandem-router: verifier %s: %s\n", address.c_str(),
                 channel.status().ToString().c_str());
    return nullptr;
  }
  owned_.push_back(v1::Verifier::NewStub(*channel));
  stubs_[index] = owned_.back().get();
  return stubs_[index];
}

}  // namespace tandem
