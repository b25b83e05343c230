// Decoding the router's raw Generate request: invalid UTF-8 named by field, size limit, garbage.
#include "services/router/request_decode.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// Serializes without protobuf's UTF-8 check by writing the wire format by hand.
std::string LengthDelimited(int field, const std::string& value) {
  std::string out(1, static_cast<char>((field << 3) | 2));
  size_t n = value.size();
  do {
    char byte = static_cast<char>(n & 0x7f);
    n >>= 7;
    if (n != 0) byte = static_cast<char>(byte | 0x80);
    out += byte;
  } while (n != 0);
  return out + value;
}

TEST(RequestDecodeTest, DecodesAValidRequest) {
  v1::GenerateRequest request;
  request.set_prompt("héllo");
  request.set_max_tokens(7);
  request.mutable_sampling()->set_top_k(3);
  auto decoded = DecodeGenerateRequest(Buffer(request.SerializeAsString()));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->prompt(), "héllo");
  router::RouterRequest native = ToRouterRequest(*decoded);
  EXPECT_EQ(native.input, router::RouterRequest::Input::kPrompt);
  EXPECT_EQ(native.input_size, 6u);
  EXPECT_EQ(native.max_tokens, 7);
  EXPECT_EQ(native.top_k, 3);
}

TEST(RequestDecodeTest, NamesTheStringFieldWithInvalidUtf8) {
  auto prompt = DecodeGenerateRequest(Buffer(LengthDelimited(2, "ab\xff")));
  EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(prompt.status().message().find("prompt is not valid UTF-8"), std::string::npos)
      << prompt.status();

  const std::string good_turn = LengthDelimited(1, "user") + LengthDelimited(2, "hi");
  const std::string bad_turn = LengthDelimited(1, "user") + LengthDelimited(2, "caf\xc3(");
  const std::string chat = LengthDelimited(1, good_turn) + LengthDelimited(1, bad_turn);
  auto content = DecodeGenerateRequest(Buffer(LengthDelimited(3, chat)));
  EXPECT_EQ(content.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(content.status().message().find("chat.messages[1].content is not valid UTF-8"),
            std::string::npos)
      << content.status();

  auto stop = DecodeGenerateRequest(
      Buffer(LengthDelimited(2, "ok") + LengthDelimited(7, "x") + LengthDelimited(7, "\x80")));
  EXPECT_NE(stop.status().message().find("stop[1] is not valid UTF-8"), std::string::npos)
      << stop.status();
}

TEST(RequestDecodeTest, RefusesOversizedAndMalformedRequests) {
  auto big = DecodeGenerateRequest(Buffer(LengthDelimited(2, std::string(100, 'a'))), 64);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("the router accepts at most 64 bytes"), std::string::npos)
      << big.status();
  auto garbage = DecodeGenerateRequest(Buffer("\xff\xff\xff"));
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(garbage.status().message().find("not a valid tandem.v1.GenerateRequest"),
            std::string::npos);
}

// A chat whose first message has an invalid UTF-8 role and whose bytes then break off: refused
// as malformed without reaching protobuf's typed parse, which would log an error line to the
// server's stderr for the string first (a line per request; found by tests/fuzz).
TEST(RequestDecodeTest, MalformedMessageFieldIsRefusedWithoutProtobufLogging) {
  const std::string message = LengthDelimited(1, "\xc3") +
                              "\x12\x05"
                              "ab";  // content cut short
  const std::string chat = LengthDelimited(1, message);
  testing::internal::CaptureStderr();
  auto decoded = DecodeGenerateRequest(Buffer(LengthDelimited(3, chat)));
  const std::string logged = testing::internal::GetCapturedStderr();
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("malformed protobuf"), std::string::npos)
      << decoded.status();
  EXPECT_EQ(logged, "");
}

TEST(RequestDecodeTest, ConvertsEveryInputKind) {
  v1::GenerateRequest request;
  EXPECT_EQ(ToRouterRequest(request).input, router::RouterRequest::Input::kNone);
  request.mutable_chat()->add_messages();
  EXPECT_EQ(ToRouterRequest(request).input, router::RouterRequest::Input::kChat);
  EXPECT_EQ(ToRouterRequest(request).input_size, 1u);
  request.mutable_token_ids()->add_ids(4);
  request.mutable_token_ids()->add_ids(5);
  EXPECT_EQ(ToRouterRequest(request).input, router::RouterRequest::Input::kTokenIds);
  EXPECT_EQ(ToRouterRequest(request).input_size, 2u);
}

}  // namespace
}  // namespace tandem
