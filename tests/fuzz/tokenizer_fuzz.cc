// libFuzzer target for the tokenizer. The first input byte picks what is fuzzed:
//   even: the rest is text for the fixture tokenizer (qwen2_style). Valid UTF-8 must encode,
//         decode back to its NFC form, stream through the incremental detokenizer to the same
//         text, and NFC must agree with utf8proc applied to the whole text. Invalid UTF-8 must
//         be rejected with InvalidArgument.
//   odd:  the rest is a tokenizer.json; when it loads, a fixed text must round-trip through it
//         without crashing.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "utf8proc.h"
#include "worker/tokenizer/internal/utf8.h"
#include "worker/tokenizer/tokenizer.h"

#ifndef TANDEM_TOKENIZER_FIXTURE
#error "TANDEM_TOKENIZER_FIXTURE must name the fixture tokenizer.json"
#endif

namespace {

void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "tokenizer_fuzz: check failed: %s\n", what);
    std::abort();
  }
}

const tandem::Tokenizer& FixtureTokenizer() {
  static const tandem::Tokenizer* const tokenizer = [] {
    auto loaded = tandem::Tokenizer::FromFile(TANDEM_TOKENIZER_FIXTURE);
    if (!loaded.ok()) {
      std::fprintf(stderr, "tokenizer_fuzz: %s\n", loaded.status().ToString().c_str());
      std::abort();
    }
    return loaded->release();
  }();
  return *tokenizer;
}

// NFC of the whole text in one utf8proc call: the oracle for the library's region-wise NFC.
std::string WholeNfc(std::string_view text) {
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  Check(length >= 0, "utf8proc accepts valid UTF-8");
  std::string result(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
  std::free(mapped);
  return result;
}

void FuzzText(std::string_view text) {
  const tandem::Tokenizer& tokenizer = FixtureTokenizer();
  const bool valid = tandem::IsValidUtf8(text);
  auto with_special = tokenizer.Encode(text);
  auto ids = tokenizer.Encode(text, /*parse_special=*/false);
  if (!valid) {
    Check(!ids.ok() && ids.status().code() == absl::StatusCode::kInvalidArgument,
          "invalid UTF-8 is InvalidArgument");
    Check(!with_special.ok(), "invalid UTF-8 is rejected with special parsing too");
    Check(tandem::IsValidUtf8(tandem::ToValidUtf8(text)), "ToValidUtf8 output is valid");
    return;
  }
  Check(ids.ok() && with_special.ok(), "valid UTF-8 encodes");
  const std::string nfc = tandem::tokenizer_internal::Nfc(text);
  Check(nfc == WholeNfc(text), "region-wise NFC equals whole-text NFC");

  auto decoded = tokenizer.Decode(*ids);
  Check(decoded.ok(), "encoded ids decode");
  // Without special parsing only the non-special added token "café" can appear; it decodes
  // from its NFC spelling, so the round trip is exact only when it is absent.
  const auto cafe = tokenizer.TokenId("caf\xC3\xA9");
  bool has_cafe = false;
  for (const int32_t id : *ids) has_cafe |= cafe.has_value() && id == *cafe;
  if (!has_cafe) Check(*decoded == nfc, "decode(encode(x)) == NFC(x)");

  auto decoded_special = tokenizer.Decode(*with_special);
  Check(decoded_special.ok(), "ids with specials decode");
  tandem::IncrementalDetokenizer detokenizer(tokenizer, /*skip_special=*/false);
  std::string streamed;
  for (const int32_t id : *with_special) {
    auto delta = detokenizer.Push(std::vector<int32_t>{id});
    Check(delta.ok(), "detokenizer accepts encoded ids");
    Check(tandem::IsValidUtf8(*delta), "detokenizer emits valid UTF-8");
    streamed += *delta;
  }
  streamed += detokenizer.Flush();
  Check(streamed == tandem::ToValidUtf8(*decoded_special), "streamed text equals full decode");
}

void FuzzJson(std::string_view json_text) {
  auto tokenizer = tandem::Tokenizer::FromJson(json_text);
  if (!tokenizer.ok()) return;
  const std::string sample = "Hello, w\xC3\xB6rld! 123 <|im_start|> \xE4\xBD\xA0\xE5\xA5\xBD\n";
  auto ids = (*tokenizer)->Encode(sample);
  if (!ids.ok()) return;
  for (const int32_t id : *ids) {
    Check(id >= 0 && id < (*tokenizer)->vocab_size(), "encoded ids are in range");
  }
  Check((*tokenizer)->Decode(*ids).ok(), "encoded ids decode");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    FuzzText(rest);
  } else {
    FuzzJson(rest);
  }
  return 0;
}
