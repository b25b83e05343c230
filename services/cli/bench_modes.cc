// `tandem bench modes`: runs each decoding-mode variant over the same held-out prompts and
// compares it with AR greedy decoding of the same prompts.
#include "services/cli/bench_modes.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "kernels/cpu/gemm.h"
#include "nlohmann/json.hpp"
#include "services/cli/bench_prompts.h"
#include "services/cli/locate.h"
#include "worker/decoding/modes.h"
#include "worker/decoding/token_logprobs.h"
#include "worker/engine/local_generator.h"
#include "worker/model/dflash.h"

namespace tandem::cli {

namespace {

// One row of the table: a mode with options that differ from its defaults in `label`.
struct Variant {
  std::string mode;
  std::string label;
  ModeOptions options;
  nlohmann::json options_json;  // the options that differ from the defaults
};

// Sums over the prompts of one category.
struct Totals {
  int prompts = 0;
  int tokens = 0;
  int forwards = 0;
  int drafter_forwards = 0;
  int steps_with_drafts = 0;
  int drafted = 0;
  int accepted = 0;
  double seconds = 0;
  int exact_sequences = 0;  // prompts whose tokens equal AR's
  int equal_tokens = 0;     // positions i where token i equals AR's token i
  int compared_tokens = 0;  // sum of max(len, AR len)
  // The same against the target's `diffusion` decode (its block-diffusion pathway), when the
  // target has one: the reference of the lossy modes that approximate it (simsd).
  int exact_diffusion_sequences = 0;
  int equal_diffusion_tokens = 0;
  int compared_diffusion_tokens = 0;
  double ar_nll = 0;  // sum over the completion tokens, nats (ArNll)
  bool lossless = true;
};

// The negative log-likelihood (nats, summed) that the model's AR pathway gives `tokens` after
// `prompt`, teacher-forced in one causal forward: how plausible a lossy mode's text is to the
// target, next to the same figure for AR greedy's own text.
absl::StatusOr<double> ArNll(Transformer& model, std::span<const int32_t> prompt,
                             std::span<const int32_t> tokens) {
  if (tokens.empty() || prompt.empty()) return 0.0;
  std::vector<int32_t> seq(prompt.begin(), prompt.end());
  seq.insert(seq.end(), tokens.begin(), tokens.end());
  seq.pop_back();  // the last token is predicted, never read
  const int n = static_cast<int>(seq.size());
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<int32_t> outputs(tokens.size());
  std::iota(outputs.begin(), outputs.end(), static_cast<int32_t>(prompt.size()) - 1);
  KvCache kv(model.KvOptions(n + 16));
  TANDEM_RETURN_IF_ERROR(kv.AddSequence(1));
  if (!kv.Reserve(1, n)) return absl::ResourceExhaustedError("no KV for the AR-NLL forward");
  Extend extend{.seq = 1, .tokens = seq, .positions = positions, .outputs = outputs};
  TANDEM_ASSIGN_OR_RETURN(std::vector<ExtendOutput> out, model.Forward({&extend, 1}, kv));
  const int vocab = model.config().vocab_size;
  double nll = 0;
  for (size_t r = 0; r < tokens.size(); ++r) {
    nll -= RowLogprob(LogitsRow(out[0], static_cast<int>(r), vocab), tokens[r], 0).logprob;
  }
  return nll;
}

// The default variant of every implemented mode, plus option sweeps worth comparing for the
// modes known here; modes added later get their default row without code changes.
std::vector<Variant> AllVariants() {
  std::vector<Variant> variants;
  for (const std::string& mode : ImplementedModes()) {
    variants.push_back({mode, mode, ModeOptions{}, nlohmann::json::object()});
    if (mode == "jacobi") {
      for (const auto& [n, k] : std::vector<std::pair<int, int>>{{16, 2}, {8, 1}, {8, 2}}) {
        Variant v{mode, absl::StrCat("jacobi n=", n, " K=", k), ModeOptions{}, {}};
        v.options.jacobi_block_size = n;
        v.options.jacobi_blocks = k;
        v.options_json = {{"jacobi_block_size", n}, {"jacobi_blocks", k}};
        variants.push_back(std::move(v));
      }
      Variant plain{mode, "jacobi no-recycling", ModeOptions{}, {}};
      plain.options.jacobi_pool_size = 0;
      plain.options.jacobi_candidates = 0;
      plain.options_json = {{"jacobi_pool_size", 0}, {"jacobi_candidates", 0}};
      variants.push_back(std::move(plain));
    } else if (mode == "spec") {
      for (int gamma : {2, 8}) {
        Variant v{mode, absl::StrCat("spec gamma=", gamma), ModeOptions{}, {}};
        v.options.spec_gamma = gamma;
        v.options_json = {{"spec_gamma", gamma}};
        variants.push_back(std::move(v));
      }
    } else if (mode == "simsd") {
      for (int gamma : {2, 4}) {
        Variant v{mode, absl::StrCat("simsd gamma=", gamma), ModeOptions{}, {}};
        v.options.simsd_gamma = gamma;
        v.options_json = {{"simsd_gamma", gamma}};
        variants.push_back(std::move(v));
      }
    } else if (mode == "self_spec") {
      Variant v{mode, "self_spec k=4", ModeOptions{}, {}};
      v.options.self_spec_draft_len = 4;
      v.options_json = {{"self_spec_draft_len", 4}};
      variants.push_back(std::move(v));
    } else if (mode == "isd") {
      for (int n : {2, 3, 5}) {
        Variant v{mode, absl::StrCat("isd N=", n), ModeOptions{}, {}};
        v.options.isd_stride = n;
        v.options_json = {{"isd_stride", n}};
        variants.push_back(std::move(v));
      }
    } else if (mode == "nsp") {
      for (float t : {0.7f, 0.5f}) {
        Variant v{mode, absl::StrCat("nsp tau=", t), ModeOptions{}, {}};
        v.options.nsp_tau = t;
        v.options_json = {{"nsp_tau", t}};
        variants.push_back(std::move(v));
      }
      Variant entropy{mode, "nsp entropy tau=0.9", ModeOptions{}, {}};
      entropy.options.nsp_confidence = "entropy";
      entropy.options_json = {{"nsp_confidence", "entropy"}};
      variants.push_back(std::move(entropy));
      Variant verify{mode, "nsp verify", ModeOptions{}, {}};
      verify.options.nsp_verify = true;
      verify.options_json = {{"nsp_verify", true}};
      variants.push_back(std::move(verify));
      Variant quadratic{mode, "nsp quadratic", ModeOptions{}, {}};
      quadratic.options.nsp_quadratic = true;
      quadratic.options_json = {{"nsp_quadratic", true}};
      variants.push_back(std::move(quadratic));
    } else if (mode == "diffusion") {
      for (float t : {0.5f, 0.0f}) {
        Variant v{mode, absl::StrCat("diffusion t=", t), ModeOptions{}, {}};
        v.options.diffusion_threshold = t;
        v.options_json = {{"diffusion_threshold", t}};
        variants.push_back(std::move(v));
      }
    }
  }
  return variants;
}

void Add(const GenerateResult& r, double ar_nll, const std::vector<int32_t>& ar_tokens,
         const std::vector<int32_t>* diffusion_tokens, Totals* t) {
  const int n = static_cast<int>(r.tokens.size());
  const int ar_n = static_cast<int>(ar_tokens.size());
  ++t->prompts;
  t->tokens += n;
  t->forwards += r.forwards;
  t->drafter_forwards += r.drafter_forwards;
  t->steps_with_drafts += r.steps_with_drafts;
  t->drafted += r.drafted;
  t->accepted += r.accepted;
  t->seconds += r.seconds;
  t->ar_nll += ar_nll;
  t->lossless = r.lossless;
  if (r.tokens == ar_tokens) ++t->exact_sequences;
  for (int i = 0; i < std::min(n, ar_n); ++i) t->equal_tokens += r.tokens[i] == ar_tokens[i];
  t->compared_tokens += std::max(n, ar_n);
  if (diffusion_tokens != nullptr) {
    const std::vector<int32_t>& d = *diffusion_tokens;
    const int d_n = static_cast<int>(d.size());
    if (r.tokens == d) ++t->exact_diffusion_sequences;
    for (int i = 0; i < std::min(n, d_n); ++i) t->equal_diffusion_tokens += r.tokens[i] == d[i];
    t->compared_diffusion_tokens += std::max(n, d_n);
  }
}

// A fraction as JSON, null when nothing was compared.
nlohmann::json Fraction(int part, int whole) {
  return whole > 0 ? nlohmann::json(static_cast<double>(part) / whole) : nlohmann::json(nullptr);
}

std::optional<double> AcceptanceLength(const Totals& t) {
  if (t.steps_with_drafts == 0) return std::nullopt;
  return static_cast<double>(t.accepted + t.steps_with_drafts) / t.steps_with_drafts;
}

nlohmann::json RowJson(const Variant& v, const std::string& category, const Totals& t) {
  const std::optional<double> accept = AcceptanceLength(t);
  return {
      {"mode", v.mode},
      {"variant", v.label},
      {"options", v.options_json},
      {"category", category},
      {"lossless", t.lossless},
      {"prompts", t.prompts},
      {"tokens", t.tokens},
      {"forwards", t.forwards},
      {"drafter_forwards", t.drafter_forwards},
      {"tokens_per_forward", t.forwards > 0 ? static_cast<double>(t.tokens) / t.forwards : 0.0},
      {"steps_with_drafts", t.steps_with_drafts},
      {"drafted_tokens", t.drafted},
      {"accepted_tokens", t.accepted},
      {"mean_acceptance_length", accept ? nlohmann::json(*accept) : nlohmann::json(nullptr)},
      {"seconds", t.seconds},
      {"cpu_tokens_per_second", t.seconds > 0 ? t.tokens / t.seconds : 0.0},
      {"exact_match_sequences",
       t.prompts > 0 ? static_cast<double>(t.exact_sequences) / t.prompts : 0.0},
      {"exact_match_tokens",
       t.compared_tokens > 0 ? static_cast<double>(t.equal_tokens) / t.compared_tokens : 0.0},
      {"exact_match_sequences_vs_diffusion",
       Fraction(t.exact_diffusion_sequences, t.compared_diffusion_tokens > 0 ? t.prompts : 0)},
      {"exact_match_tokens_vs_diffusion",
       Fraction(t.equal_diffusion_tokens, t.compared_diffusion_tokens)},
      {"ar_nll", t.tokens > 0 ? t.ar_nll / t.tokens : 0.0},
  };
}

constexpr const char* kDefinitions[] = {
    "TPF: completion tokens / target forwards, summed over the category's prompts; every "
    "target forward counts (prefill, draft and verify forwards alike; a separate drafter's "
    "forwards are listed apart).",
    "acc.len: mean acceptance length = (accepted drafts + steps with drafts) / steps with drafts "
    "-- the tokens a drafting step commits: its accepted drafts plus the one token the target "
    "adds (bonus or correction); a self_spec cycle (draft + verify forward) is one such step. "
    "'-' when the mode drafts nothing.",
    "tok/s: completion tokens / wall seconds on this CPU (prefill included, batch 1); wider "
    "extends cost the CPU nearly proportionally more, unlike a GPU.",
    "seq=AR: fraction of prompts whose tokens equal AR greedy's exactly; tok=AR: positions whose "
    "token equals AR's at the same index / sum of max(len, AR len).",
    "seq=diff, tok=diff: the same against the target's own `diffusion` decode (default "
    "options); '-' when the target has no diffusion pathway.",
    "AR-NLL: the target's AR negative log-likelihood of the completion tokens after the "
    "prompt, nats per token (teacher-forced): how plausible a lossy mode's text is to the AR "
    "model, next to the ar row (its own greedy text).",
};

}  // namespace

int RunBenchModes(const BenchModesArgs& args) {
  kernels::cpu::SetBlasThreads(args.threads);
  const int threads = kernels::cpu::BlasThreads();
  omp_set_num_threads(threads);
  if (args.max_tokens <= 0) {
    std::fprintf(stderr, "bench modes: --max-tokens must be positive, got %d\n", args.max_tokens);
    return 1;
  }
  const absl::StatusOr<std::string> found_model = FindModelDir(args.model_dir);
  if (!found_model.ok()) {
    std::fprintf(stderr, "bench modes: %s\n", std::string(found_model.status().message()).c_str());
    return 1;
  }
  const std::string& model_dir = *found_model;
  const std::string prompts_path =
      args.prompts_file.empty() ? model_dir + "/fixtures/bench_prompts.json" : args.prompts_file;
  auto prompts = LoadPrompts(prompts_path, args.prompts);
  if (!prompts.ok()) {
    std::fprintf(stderr, "bench modes: %s\n", prompts.status().ToString().c_str());
    return 1;
  }
  std::vector<Variant> variants = AllVariants();
  if (!args.modes.empty()) {
    std::vector<Variant> chosen;
    for (const std::string& want : args.modes) {
      bool matched = false;
      for (const Variant& v : variants) {
        const bool taken = std::any_of(chosen.begin(), chosen.end(),
                                       [&](const Variant& c) { return c.label == v.label; });
        if (v.mode != want && v.label != want) continue;
        matched = true;
        if (!taken) chosen.push_back(v);
      }
      if (!matched) {
        std::vector<std::string> labels;
        for (const Variant& v : variants) labels.push_back(v.label);
        std::fprintf(stderr, "bench modes: unknown mode or variant '%s'; this build has: %s\n",
                     want.c_str(), absl::StrJoin(labels, ", ").c_str());
        return 1;
      }
    }
    variants = std::move(chosen);
  }

  absl::StatusOr<DeviceOptions> device =
      ResolveDevice(args.device, args.cuda_graphs, args.cpu_weights);
  if (!device.ok()) {
    std::fprintf(stderr, "bench modes: --device: %s\n",
                 std::string(device.status().message()).c_str());
    return 1;
  }
  auto target = LoadModelDir(model_dir, *device, args.merge_lora);
  if (!target.ok()) {
    std::fprintf(stderr, "bench modes: %s\n", target.status().ToString().c_str());
    return 1;
  }
  if (target->sampler != nullptr) {
    // The trained sampler beside each confidence threshold of `diffusion`.
    std::vector<Variant> with_sampler;
    for (const Variant& v : variants) {
      with_sampler.push_back(v);
      if (v.label != "diffusion") continue;
      for (float t : {0.5f, 0.3f}) {
        Variant sampled{v.mode, absl::StrCat("diffusion sampler=", t), v.options, v.options_json};
        sampled.options.diffusion_sampler = t;
        sampled.options_json["diffusion_sampler"] = t;
        with_sampler.push_back(std::move(sampled));
      }
    }
    variants = std::move(with_sampler);
  }
  if (!args.lora_dir.empty()) {
    if (absl::Status attached = AttachLoraAdapter(*target, args.lora_dir); !attached.ok()) {
      std::fprintf(stderr, "bench modes: --lora: %s\n", attached.ToString().c_str());
      return 1;
    }
    // Each drafting variant with and without the adapter, side by side.
    std::vector<Variant> with_lora;
    for (const Variant& v : variants) {
      with_lora.push_back(v);
      if (v.mode != "isd" && v.mode != "self_spec" && v.mode != "self_spec_quadratic") continue;
      Variant lora = v;
      lora.label += " +lora";
      lora.options.lora_drafts = true;
      lora.options_json["lora_drafts"] = true;
      with_lora.push_back(std::move(lora));
    }
    variants = std::move(with_lora);
  }
  const std::string drafter_dir =
      args.drafter_dir.empty() ? DefaultDrafterDir(model_dir) : args.drafter_dir;
  const bool self_drafting = std::filesystem::weakly_canonical(drafter_dir) ==
                             std::filesystem::weakly_canonical(model_dir);
  absl::StatusOr<LoadedModel> separate_drafter;
  LoadedModel* drafter = &*target;
  // A DFlash drafter drafts spec's blocks from the target's hidden states (no model of its own
  // to load as a LoadedModel: it uses the target's embeddings and LM head).
  std::unique_ptr<DFlashModel> dflash;
  if (!self_drafting && IsDFlashCheckpoint(drafter_dir)) {
    absl::StatusOr<std::unique_ptr<DFlashModel>> made =
        DFlashModel::Load(drafter_dir, target->model.get());
    if (!made.ok()) {
      std::fprintf(stderr, "bench modes: drafter: %s\n", made.status().ToString().c_str());
      return 1;
    }
    dflash = std::move(*made);
    for (const Variant& v : variants) {
      if (v.mode == "simsd") {
        std::fprintf(stderr,
                     "bench modes: a DFlash drafter (%s) drafts for spec only; leave simsd out of "
                     "--modes or name another drafter\n",
                     drafter_dir.c_str());
        return 1;
      }
    }
  } else if (!self_drafting) {
    separate_drafter = LoadModelDir(drafter_dir, *device);
    if (!separate_drafter.ok()) {
      std::fprintf(stderr, "bench modes: drafter: %s\n",
                   separate_drafter.status().ToString().c_str());
      return 1;
    }
    drafter = &*separate_drafter;
  }
  LocalGenerator generator(&*target);
  auto generate = [&](const Variant& v, const Prompt& p) {
    GenerateOptions options;
    options.mode = v.mode;
    options.mode_options = v.options;
    options.max_tokens = args.max_tokens;
    options.drafter = drafter;
    options.dflash_drafter = dflash.get();
    return generator.Generate(p.text, options);
  };

  // AR greedy is the reference of every exact-match column; its first run also warms caches.
  const Variant ar{"ar", "ar", ModeOptions{}, nlohmann::json::object()};
  (void)generate(ar, prompts->front());
  std::vector<GenerateResult> reference;
  for (const Prompt& p : *prompts) {
    auto r = generate(ar, p);
    if (!r.ok()) {
      std::fprintf(stderr, "bench modes: ar on %s: %s\n", p.source.c_str(),
                   r.status().ToString().c_str());
      return 1;
    }
    reference.push_back(*std::move(r));
  }
  // The target's block-diffusion decode, when it has that pathway (InvalidArgument: it has not).
  const Variant diffusion{"diffusion", "diffusion", ModeOptions{}, nlohmann::json::object()};
  std::vector<GenerateResult> diffusion_reference;
  for (const Prompt& p : *prompts) {
    auto r = generate(diffusion, p);
    if (!r.ok() && absl::IsInvalidArgument(r.status())) break;
    if (!r.ok()) {
      std::fprintf(stderr, "bench modes: diffusion on %s: %s\n", p.source.c_str(),
                   r.status().ToString().c_str());
      return 1;
    }
    diffusion_reference.push_back(*std::move(r));
  }
  const bool has_diffusion = diffusion_reference.size() == prompts->size();

  std::vector<std::string> categories;
  for (const Prompt& p : *prompts) {
    if (std::find(categories.begin(), categories.end(), p.category) == categories.end()) {
      categories.push_back(p.category);
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  nlohmann::json skipped = nlohmann::json::array();
  nlohmann::json outputs = nlohmann::json::array();
  std::vector<std::pair<const Variant*, std::map<std::string, Totals>>> results;
  for (const Variant& v : variants) {
    std::map<std::string, Totals> totals;
    std::string skip_reason;
    for (size_t i = 0; i < prompts->size(); ++i) {
      const Prompt& p = (*prompts)[i];
      absl::StatusOr<GenerateResult> r =
          v.label == "ar" ? absl::StatusOr<GenerateResult>(reference[i]) : generate(v, p);
      if (!r.ok() && i == 0 && absl::IsInvalidArgument(r.status())) {
        // The model cannot run this mode (e.g. no <|mask|> token): a row, not a failure.
        skip_reason = std::string(r.status().message());
        break;
      }
      if (!r.ok()) {
        std::fprintf(stderr, "bench modes: %s on %s: %s\n", v.label.c_str(), p.source.c_str(),
                     r.status().ToString().c_str());
        return 1;
      }
      absl::StatusOr<double> nll = ArNll(*target->model, r->prompt_ids, r->tokens);
      if (!nll.ok()) {
        std::fprintf(stderr, "bench modes: AR-NLL of %s on %s: %s\n", v.label.c_str(),
                     p.source.c_str(), nll.status().ToString().c_str());
        return 1;
      }
      Add(*r, *nll, reference[i].tokens, has_diffusion ? &diffusion_reference[i].tokens : nullptr,
          &totals[p.category]);
      if (args.tokens) {
        outputs.push_back({{"variant", v.label},
                           {"prompt", i},
                           {"source", p.source},
                           {"category", p.category},
                           {"tokens", r->tokens}});
      }
    }
    if (!skip_reason.empty()) {
      skipped.push_back({{"variant", v.label}, {"reason", skip_reason}});
      continue;
    }
    for (const std::string& c : categories) rows.push_back(RowJson(v, c, totals[c]));
    results.emplace_back(&v, std::move(totals));
  }

  std::map<std::string, int> per_category;
  for (const Prompt& p : *prompts) ++per_category[p.category];
  if (args.json) {
    const nlohmann::json j = {
        {"model", model_dir},
        {"drafter", drafter_dir},
        {"lora", args.lora_dir},
        {"merge_lora", args.merge_lora},
        {"drafter_is_target", self_drafting},
        {"prompts_file", prompts_path},
        {"prompts_per_category", per_category},
        {"max_tokens", args.max_tokens},
        {"sampling", "greedy"},
        {"threads", threads},
        {"definitions", kDefinitions},
        {"device", DeviceName(device->device)},
        {"results", rows},
        {"skipped", skipped},
    };
    nlohmann::json out = j;
    if (args.tokens) out["outputs"] = outputs;
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }

  std::printf("tandem bench modes  (model %s, greedy, up to %d new tokens, %d threads)\n",
              model_dir.c_str(), args.max_tokens, threads);
  if (!args.merge_lora.empty()) {
    std::printf("merged adapter: %s (every variant runs the adapted model)\n",
                args.merge_lora.c_str());
  }
  std::printf("prompts: %s (", prompts_path.c_str());
  for (size_t i = 0; i < categories.size(); ++i) {
    std::printf("%s%d %s", i > 0 ? ", " : "", per_category[categories[i]], categories[i].c_str());
  }
  std::printf(")\n");
  if (self_drafting) {
    std::printf(
        "spec drafter: the target itself -- self-drafting accepts every greedy draft, so the "
        "spec rows are an upper bound, not a real drafter's numbers\n");
  } else {
    std::printf("spec drafter: %s\n", drafter_dir.c_str());
  }
  for (const std::string& c : categories) {
    std::printf("\n[%s]\n", c.c_str());
    std::printf("%-22s %-8s %6s %8s %9s %8s %8s %12s %7s %7s %8s %8s %7s\n", "mode", "lossless",
                "TPF", "acc.len", "forwards", "drafter", "tokens", "tok/s (CPU)", "seq=AR",
                "tok=AR", "seq=diff", "tok=diff", "AR-NLL");
    for (const auto& [v, totals] : results) {
      const Totals& t = totals.at(c);
      const std::optional<double> accept = AcceptanceLength(t);
      const std::string accept_text = accept ? absl::StrFormat("%.2f", *accept) : "-";
      const bool vs_diffusion = t.compared_diffusion_tokens > 0;
      const std::string seq_diffusion =
          vs_diffusion ? absl::StrFormat("%.2f", 1.0 * t.exact_diffusion_sequences / t.prompts)
                       : "-";
      const std::string tok_diffusion =
          vs_diffusion ? absl::StrFormat(
                             "%.2f", 1.0 * t.equal_diffusion_tokens / t.compared_diffusion_tokens)
                       : "-";
      std::printf(
          "%-22s %-8s %6.2f %8s %9d %8d %8d %12.1f %7.2f %7.2f %8s %8s %7.3f\n", v->label.c_str(),
          t.lossless ? "yes" : "NO", t.forwards > 0 ? 1.0 * t.tokens / t.forwards : 0.0,
          accept_text.c_str(), t.forwards, t.drafter_forwards, t.tokens,
          t.seconds > 0 ? t.tokens / t.seconds : 0.0,
          t.prompts > 0 ? 1.0 * t.exact_sequences / t.prompts : 0.0,
          t.compared_tokens > 0 ? 1.0 * t.equal_tokens / t.compared_tokens : 0.0,
          seq_diffusion.c_str(), tok_diffusion.c_str(), t.tokens > 0 ? t.ar_nll / t.tokens : 0.0);
    }
  }
  if (!skipped.empty()) std::printf("\n");
  for (const auto& s : skipped) {
    std::printf("skipped %s: %s\n", s["variant"].get<std::string>().c_str(),
                s["reason"].get<std::string>().c_str());
  }
  std::printf("\n");
  for (const char* d : kDefinitions) std::printf("%s\n", d);
  return 0;
}

}  // namespace tandem::cli
