#include "worker/template/chat_tools.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/template/chat_template.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

constexpr char kTools[] =
    R"([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])";
constexpr char kCalls[] =
    R"([{"id": "call_1", "type": "function", "function": {"name": "get_weather",
        "arguments": "{\"city\": \"Paris\"}"}}])";

std::vector<ChatTurn> Conversation() {
  return {{"system", "Be brief."},
          {"user", "Weather in Paris?"},
          {"assistant", "", kCalls, ""},
          {"tool", "18 C", "", "call_1"}};
}

TEST(ChatToolsTest, TemplatesSeeToolsCallsAndAnswers) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> chat = ChatTemplate::FromSource(
      "{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
      "{% for m in messages %}{{ m.role }}"
      "{% if m.tool_calls %}>{{ m.tool_calls[0].function.name }}"
      "({{ m.tool_calls[0].function.arguments }}){% endif %}"
      "{% if m.tool_call_id %}<{{ m.tool_call_id }}{% endif %}:{{ m.content }};{% endfor %}",
      "", "");
  ASSERT_TRUE(chat.ok()) << chat.status();
  absl::StatusOr<std::string> text = (*chat)->Apply(Conversation(), true, kTools);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "[get_weather]system:Be brief.;user:Weather in Paris?;"
            "assistant>get_weather({\"city\": \"Paris\"}):;tool<call_1:18 C;");
  EXPECT_FALSE((*chat)->Apply(Conversation(), true, "{\"not\": \"a list\"}").ok());
}

TEST(ChatToolsTest, ChatMlListsToolsAndWritesCallsAsHermesBlocks) {
  absl::StatusOr<std::string> text = ApplyChatMlWithTools(Conversation(), kTools);
  ASSERT_TRUE(text.ok()) << text.status();
  // The tools join the conversation's own system turn.
  EXPECT_THAT(*text, ::testing::StartsWith("<|im_start|>system\nBe brief.\n\n"));
  EXPECT_THAT(*text, HasSubstr("<tools>\n{\"type\":\"function\",\"function\":{\"name\":"
                               "\"get_weather\",\"parameters\":{}}}\n</tools>"));
  EXPECT_THAT(*text, HasSubstr("<|im_start|>assistant\n<tool_call>\n{\"name\":\"get_weather\","
                               "\"arguments\":{\"city\":\"Paris\"}}\n</tool_call><|im_end|>"));
  EXPECT_THAT(*text, HasSubstr("<|im_start|>tool\n<tool_response>\n18 C\n</tool_response>"));
  EXPECT_THAT(*text, ::testing::EndsWith("<|im_start|>assistant\n"));
  // Without tools or tool turns it is plain ChatML.
  const std::vector<ChatTurn> plain = {{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_EQ(*ApplyChatMlWithTools(plain, ""), ApplyChatMl(plain));
  EXPECT_EQ(ApplyChatMlWithTools(Conversation(), "3").status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<ChatTurn> bad = Conversation();
  bad[2].tool_calls = "{}";
  EXPECT_EQ(ApplyChatMlWithTools(bad, kTools).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
