// The chat-template renderer against Python's jinja2 (with Hugging Face's settings) byte for
// byte: every fixture template (written in the style of Llama 3.x, Mistral and Qwen2.5/3 chat
// templates, a tools template among them, plus feature tests) meets every fixture conversation,
// and the output, or the template's own refusal, equals tools/chat_templates/make_goldens.py's.
// Then loading from a checkpoint directory, and the bounds.
#include "worker/template/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/template/render.h"

namespace tandem {
namespace {

const std::string kFixtures = std::string(TANDEM_SOURCE_DIR) + "/tests/worker/template/fixtures";

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ChatTemplateTest, RendersLikeJinja2OnEveryFixture) {
  const nlohmann::ordered_json cases =
      nlohmann::ordered_json::parse(Read(kFixtures + "/cases.json"));
  const nlohmann::json goldens = nlohmann::json::parse(Read(kFixtures + "/goldens.json"));
  ASSERT_EQ(goldens.size(), cases["templates"].size() * cases["cases"].size());
  for (const nlohmann::json& golden : goldens) {
    const std::string name = golden["template"];
    const nlohmann::ordered_json& tokens = cases["templates"][name];
    const nlohmann::ordered_json& c = cases["cases"][golden["case"].get<std::string>()];
    SCOPED_TRACE(name + " / " + golden["case"].get<std::string>());
    absl::StatusOr<std::unique_ptr<ChatTemplate>> chat = ChatTemplate::FromSource(
        Read(kFixtures + "/" + name + ".jinja"), tokens["bos_token"], tokens["eos_token"]);
    ASSERT_TRUE(chat.ok()) << chat.status();
    absl::StatusOr<std::string> out =
        (*chat)->Apply(c["messages"], c.value("add_generation_prompt", true),
                       c.contains("vars") ? c["vars"] : nlohmann::ordered_json::object());
    if (golden.contains("output")) {
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(*out, golden["output"].get<std::string>());
    } else {
      ASSERT_FALSE(out.ok()) << *out;
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
      if (golden["error"].is_string()) {
        EXPECT_NE(out.status().message().find(golden["error"].get<std::string>()),
                  std::string::npos)
            << out.status();
      }
    }
  }
}

TEST(ChatTemplateTest, ChatTurnsRenderAsMessages) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> chat = ChatTemplate::FromSource(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m['content'] }}{% endfor %}"
      "{% if add_generation_prompt %}[assistant]{% endif %}",
      "<s>", "</s>");
  ASSERT_TRUE(chat.ok()) << chat.status();
  const std::vector<ChatTurn> turns = {{"system", "be brief"}, {"user", "hi"}};
  EXPECT_EQ(*(*chat)->Apply(turns), "<s>[system]be brief[user]hi[assistant]");
  EXPECT_EQ(*(*chat)->Apply(turns, false), "<s>[system]be brief[user]hi");
}

// The tool-call syntax each template teaches (worker/template/tool_call_syntax.h).
TEST(ChatTemplateTest, NamesTheToolCallSyntaxItsTemplateTeaches) {
  const std::vector<std::pair<std::string, ToolCallSyntax>> fixtures = {
      {"llama3_style", ToolCallSyntax::kLlama3Json},
      {"qwen_style", ToolCallSyntax::kHermes},
      {"mistral_style", ToolCallSyntax::kHermes},  // no tools in it: the default
  };
  for (const auto& [name, syntax] : fixtures) {
    absl::StatusOr<std::unique_ptr<ChatTemplate>> chat =
        ChatTemplate::FromSource(Read(kFixtures + "/" + name + ".jinja"), "<s>", "</s>");
    ASSERT_TRUE(chat.ok()) << name << ": " << chat.status();
    EXPECT_EQ((*chat)->tool_call_syntax(), syntax) << name;
  }
  absl::StatusOr<std::unique_ptr<ChatTemplate>> mistral = ChatTemplate::FromSource(
      "{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS]{% endif %}{% endfor %}", "", "");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ((*mistral)->tool_call_syntax(), ToolCallSyntax::kMistral);
}

TEST(ChatTemplateTest, LoadsFromTheCheckpointDirectory) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("chat_template_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& file, const std::string& text) {
    std::ofstream(dir / file) << text;
  };
  absl::StatusOr<std::unique_ptr<ChatTemplate>> none = ChatTemplate::FromModelDir(dir);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);  // no template: the caller uses ChatML

  write("tokenizer_config.json",
        R"({"bos_token": {"content": "<B>"}, "eos_token": "<E>",
            "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"})");
  const std::vector<ChatTurn> turns = {{"user", "x"}};
  absl::StatusOr<std::unique_ptr<ChatTemplate>> config = ChatTemplate::FromModelDir(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*(*config)->Apply(turns), "<B>x<E>");

  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "D{{ messages | length }}"}]})");
  EXPECT_EQ(*(*ChatTemplate::FromModelDir(dir))->Apply(turns), "D1");

  write("chat_template.jinja", "J{{ messages[0].role }}\n");  // wins over the config's
  EXPECT_EQ(*(*ChatTemplate::FromModelDir(dir))->Apply(turns), "Juser");

  write("chat_template.jinja", "{% if %}");
  absl::StatusOr<std::unique_ptr<ChatTemplate>> bad = ChatTemplate::FromModelDir(dir);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("chat_template.jinja"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// Errors name the line; what the subset lacks is refused when parsed, not when rendered.
TEST(ChatTemplateTest, ErrorsNameTheLine) {
  const auto parse_error = [](const std::string& source) {
    absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromSource(source, "", "");
    EXPECT_FALSE(t.ok()) << source;
    return t.ok() ? std::string() : std::string(t.status().message());
  };
  EXPECT_NE(parse_error("a\nb\n{% for x in y %}").find("line 3"), std::string::npos);
  EXPECT_NE(parse_error("{% include 'x' %}").find("'include' is not supported"), std::string::npos);
  EXPECT_NE(parse_error("{{ 'open }}").find("not closed"), std::string::npos);
  EXPECT_NE(parse_error("{{ a b }}").find("expected '}}'"), std::string::npos);

  const auto render_error = [](const std::string& source) {
    absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromSource(source, "", "");
    EXPECT_TRUE(t.ok()) << t.status();
    absl::StatusOr<std::string> out = (*t)->Apply(std::vector<ChatTurn>{{"user", "x"}});
    EXPECT_FALSE(out.ok()) << *out;
    return std::string(out.status().message());
  };
  EXPECT_NE(render_error("\n{{ nothing.attribute }}").find("line 2: 'nothing' is undefined"),
            std::string::npos);
  EXPECT_NE(render_error("{{ messages | frobnicate }}").find("'frobnicate' is not supported"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(render_error("{% for i in range(1000) %}{% for j in range(1001) %}{% endfor %}"
                         "{% endfor %}")
                .find("iterations"),
            std::string::npos);
  EXPECT_NE(
      render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("nest deeper"),
      std::string::npos);
  EXPECT_NE(render_error("{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}")
                .find("output passed"),
            std::string::npos);
}

TEST(ChatTemplateTest, StrftimeNowPrintsTodaysDate) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t =
      ChatTemplate::FromSource("{{ strftime_now('%Y') | length }}", "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->Apply(std::vector<ChatTurn>{}), "4");
}

}  // namespace
}  // namespace tandem
