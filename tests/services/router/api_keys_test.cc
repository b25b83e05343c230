#include "services/common/api_keys.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ApiKeysTest, NoKeysAllowsEverything) {
  ApiKeys keys({"", " "});
  EXPECT_FALSE(keys.enabled());
  EXPECT_TRUE(keys.Check("").ok());
  EXPECT_TRUE(keys.Check("Bearer whatever").ok());
}

TEST(ApiKeysTest, BearerKeys) {
  ApiKeys keys({"alpha", " beta "});
  EXPECT_TRUE(keys.enabled());
  EXPECT_TRUE(keys.Check("Bearer alpha").ok());
  EXPECT_TRUE(keys.Check("bearer beta").ok());
  EXPECT_TRUE(keys.Check("  Bearer   beta ").ok());
  EXPECT_EQ(keys.Check("").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys.Check("alpha").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys.Check("Basic alpha").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys.Check("Bearer alph").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys.Check("Bearer alphaa").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys.Check("Bearer ").code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace tandem
