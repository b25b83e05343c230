#include "services/common/hidden_transport.h"

#include <unistd.h>

#include <bit>
#include <cstring>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"

#ifdef TANDEM_HIDDEN_NCCL
#include "services/common/nccl_hidden_transport.h"
#endif

namespace tandem {

static_assert(std::endian::native == std::endian::little,
              "hidden states travel as little-endian bf16 and are copied as they are");

std::string_view HiddenTransportModeName(HiddenTransportMode mode) {
  switch (mode) {
    case HiddenTransportMode::kAuto:
      return "auto";
    case HiddenTransportMode::kBytes:
      return "bytes";
    case HiddenTransportMode::kNccl:
      return "nccl";
  }
  return "unknown";
}

std::string_view HiddenTransportKindName(HiddenTransportKind kind) {
  return kind == HiddenTransportKind::kNccl ? "nccl" : "bytes";
}

absl::StatusOr<HiddenTransportMode> ParseHiddenTransportMode(std::string_view name) {
  for (HiddenTransportMode mode :
       {HiddenTransportMode::kAuto, HiddenTransportMode::kBytes, HiddenTransportMode::kNccl}) {
    if (name == HiddenTransportModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("hidden transport '", std::string(name), "' is none of auto, bytes, nccl"));
}

void AddHiddenTransportFlag(CLI::App& app, HiddenTransportMode* mode, std::string_view env_prefix) {
  app.add_option_function<std::string>(
         "--hidden-transport",
         [mode](const std::string& name) {
           absl::StatusOr<HiddenTransportMode> parsed = ParseHiddenTransportMode(name);
           if (!parsed.ok()) throw CLI::ValidationError(std::string(parsed.status().message()));
           *mode = *parsed;
         },
         "How target hidden states travel to DFlash-style drafters: auto (NCCL GPU to GPU when "
         "both sides can and their GPUs differ, else in-stream bytes), bytes (never NCCL), nccl "
         "(NCCL or a clear error: at startup when this process cannot, per stream when its "
         "peer cannot)")
      ->envname(absl::StrCat(std::string(env_prefix), "_HIDDEN_TRANSPORT"))
      ->check(CLI::IsMember({"auto", "bytes", "nccl"}))
      ->default_str("auto");
}

namespace {

std::string Hostname() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "localhost";
  return host[0] ? host : "localhost";
}

}  // namespace

HiddenTransportEnd LocalHiddenTransport(HiddenTransportMode mode) {
  HiddenTransportEnd end{.mode = mode, .hostname = Hostname()};
#ifdef TANDEM_HIDDEN_NCCL
  ProbeHiddenNccl(&end);
#else
  end.nccl = false;
  end.why_not = "this binary is built without CUDA (no NCCL)";
#endif
  if (mode == HiddenTransportMode::kBytes && end.nccl) {
    end.nccl = false;
    end.why_not = "--hidden-transport bytes";
  }
  return end;
}

absl::Status CheckHiddenTransportFlag(const HiddenTransportEnd& local) {
  if (local.mode != HiddenTransportMode::kNccl || local.nccl) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("--hidden-transport nccl is impossible here: ", local.why_not));
}

v1::HiddenTransportInfo ToInfo(const HiddenTransportEnd& end) {
  v1::HiddenTransportInfo info;
  info.set_nccl(end.nccl);
  info.set_why_not(end.why_not);
  info.set_nccl_required(end.mode == HiddenTransportMode::kNccl);
  info.set_gpu_uuid(end.gpu_uuid);
  info.set_hostname(end.hostname);
  return info;
}

HiddenTransportEnd FromInfo(const v1::WorkerInfo& info) {
  if (!info.has_hidden_transport()) {
    return HiddenTransportEnd{.nccl = false,
                              .why_not =
                                  "it does not advertise a hidden-state transport (an "
                                  "older binary?)"};
  }
  const v1::HiddenTransportInfo& t = info.hidden_transport();
  return HiddenTransportEnd{
      .mode = t.nccl_required() ? HiddenTransportMode::kNccl : HiddenTransportMode::kAuto,
      .nccl = t.nccl(),
      .why_not =
          t.nccl() ? "" : (t.why_not().empty() ? "it cannot (no reason given)" : t.why_not()),
      .gpu_uuid = t.gpu_uuid(),
      .hostname = t.hostname()};
}

HiddenTransportChoice ChooseHiddenTransport(const HiddenTransportEnd& verifier,
                                            const HiddenTransportEnd& drafter) {
  const auto where = [](const HiddenTransportEnd& end) {
    return absl::StrCat("GPU ", end.gpu_uuid.empty() ? "?" : end.gpu_uuid, " on ",
                        end.hostname.empty() ? "?" : end.hostname);
  };
  std::string obstacle;
  if (!verifier.nccl) {
    obstacle = absl::StrCat("the verifier cannot use NCCL: ", verifier.why_not);
  } else if (!drafter.nccl) {
    obstacle = absl::StrCat("the drafter cannot use NCCL: ", drafter.why_not);
  } else if (verifier.gpu_uuid.empty() || verifier.gpu_uuid == drafter.gpu_uuid) {
    // NCCL refuses two ranks of one communicator on one GPU.
    obstacle =
        absl::StrCat("verifier and drafter share ", where(verifier), " and NCCL needs two GPUs");
  }
  if (obstacle.empty()) {
    return HiddenTransportChoice{
        .kind = HiddenTransportKind::kNccl,
        .reason = absl::StrCat("both sides can use NCCL and their GPUs differ (verifier ",
                               where(verifier), ", drafter ", where(drafter), ")")};
  }
  const bool verifier_requires = verifier.mode == HiddenTransportMode::kNccl;
  const bool drafter_requires = drafter.mode == HiddenTransportMode::kNccl;
  if (verifier_requires || drafter_requires) {
    return HiddenTransportChoice{
        .kind = HiddenTransportKind::kBytes,
        .failed = true,
        .reason = absl::StrCat(verifier_requires && drafter_requires ? "both sides run"
                               : verifier_requires                   ? "the verifier runs"
                                                                     : "the drafter runs",
                               " --hidden-transport nccl but ", obstacle)};
  }
  return HiddenTransportChoice{.kind = HiddenTransportKind::kBytes, .reason = obstacle};
}

void HiddenRowsToWire(const HiddenRows& rows, v1::HiddenStates* wire) {
  wire->set_num_layers(rows.layers);
  wire->set_num_tokens(rows.tokens);
  wire->set_hidden_size(rows.hidden_size);
  wire->set_offset(rows.offset);
  wire->set_bf16(reinterpret_cast<const char*>(rows.bf16.data()),
                 rows.bf16.size() * sizeof(uint16_t));
}

absl::StatusOr<HiddenRows> HiddenRowsFromWire(const v1::HiddenStates& wire) {
  if (wire.transport() != v1::HIDDEN_TRANSPORT_BYTES) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden states at offset ", wire.offset(),
                     " say their payload comes by NCCL, but this stream has no NCCL "
                     "communicator"));
  }
  if (wire.bf16().size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden states of ", wire.bf16().size(), " bytes are not whole bf16 values"));
  }
  HiddenRows rows{.layers = wire.num_layers(),
                  .tokens = wire.num_tokens(),
                  .hidden_size = wire.hidden_size(),
                  .offset = wire.offset(),
                  .bf16 = std::vector<uint16_t>(wire.bf16().size() / 2)};
  if (!rows.bf16.empty()) std::memcpy(rows.bf16.data(), wire.bf16().data(), wire.bf16().size());
  return rows;
}

void BytesHiddenReceiver::Receive(const v1::HiddenStates* wire, Done done) {
  if (wire == nullptr) {
    done(HiddenRows{});
    return;
  }
  done(HiddenRowsFromWire(*wire));
}

#ifndef TANDEM_HIDDEN_NCCL

namespace {

absl::Status NoNccl() {
  return absl::UnimplementedError("this binary is built without CUDA (no NCCL)");
}

}  // namespace

absl::StatusOr<std::string> NewHiddenNcclUniqueId() { return NoNccl(); }

absl::StatusOr<HiddenNcclSender> StartHiddenNcclSender(const std::string& /*unique_id*/,
                                                       const NcclHiddenOptions& /*options*/,
                                                       std::function<void(absl::Status)>) {
  return NoNccl();
}

absl::StatusOr<std::unique_ptr<HiddenReceiver>> StartHiddenNcclReceiver(
    const std::string& /*unique_id*/, const NcclHiddenOptions& /*options*/,
    std::function<void(absl::Status)>) {
  return NoNccl();
}

absl::StatusOr<DeviceHiddenSink> NewDeviceHiddenSink() {
  return absl::FailedPreconditionError(
      "this binary is built without CUDA: hidden states cannot stay on a GPU");
}

#endif

}  // namespace tandem
