// A checkpoint's chat template through the engine: a chat request is prompted with the template's
// rendering (the same tokens and output as sending that text's ids), and a conversation the
// template refuses is InvalidArgument with the template's message.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/engine/collecting_sink.h"
#include "worker/engine/engine.h"

namespace tandem {
namespace {

const std::string kModelDir = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-target";

constexpr char kTemplate[] =
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'system' %}{{ raise_exception('This model has no system role') }}{% endif %}"
    "<|im_start|>{{ m.role | upper }}\\n{{ m.content | trim }}<|im_end|>\\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>ASSISTANT\\n{% endif %}";

TEST(EngineChatTemplateTest, ChatRequestsUseTheCheckpointsTemplate) {
  if (!std::filesystem::exists(kModelDir + "/config.json")) GTEST_SKIP() << "no bundled model";
  // The bundled target with a chat template of its own beside it.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("engine_chat_template_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  for (const auto& entry : std::filesystem::directory_iterator(kModelDir)) {
    if (entry.is_regular_file()) {
      std::filesystem::create_symlink(entry.path(), dir / entry.path().filename());
    }
  }
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": "<|endoftext|>", "chat_template": ")" << kTemplate << R"("})";
  absl::StatusOr<LoadedModel> model = LoadModelDir(dir.string());
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_NE(model->chat_template, nullptr);

  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(&*model, EngineOptions{}, nullptr);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::string rendered =
      "<|endoftext|><|im_start|>USER\ndef add(a, b):<|im_end|>\n<|im_start|>ASSISTANT\n";
  absl::StatusOr<std::vector<int32_t>> ids = model->tokenizer->Encode(rendered);
  ASSERT_TRUE(ids.ok()) << ids.status();

  SequenceRequest chat;
  chat.chat = {{"user", "  def add(a, b):  "}};
  chat.mode = "ar";
  chat.max_tokens = 12;
  SequenceRequest by_ids = chat;
  by_ids.chat.clear();
  by_ids.prompt_ids = *ids;
  auto chat_sink = std::make_shared<testing::CollectingSink>();
  auto ids_sink = std::make_shared<testing::CollectingSink>();
  ASSERT_TRUE((*engine)->Submit(chat, chat_sink).ok());
  ASSERT_TRUE((*engine)->Submit(by_ids, ids_sink).ok());
  ASSERT_TRUE(chat_sink->Wait());
  ASSERT_TRUE(ids_sink->Wait());
  EXPECT_EQ(chat_sink->usage().prompt_tokens, static_cast<int>(ids->size()));
  EXPECT_EQ(chat_sink->tokens(), ids_sink->tokens());
  EXPECT_FALSE(chat_sink->tokens().empty());

  SequenceRequest refused = chat;
  refused.chat = {{"system", "be brief"}, {"user", "hi"}};
  absl::StatusOr<uint64_t> id =
      (*engine)->Submit(refused, std::make_shared<testing::CollectingSink>());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("This model has no system role"), std::string::npos)
      << id.status();
}

}  // namespace
}  // namespace tandem
