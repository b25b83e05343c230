#include "worker/tokenizer/internal/utf8.h"

#include <string>

#include "gtest/gtest.h"
#include "worker/tokenizer/tokenizer.h"

namespace tandem {
namespace {

TEST(Utf8Test, AcceptsWellFormedText) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8(std::string("a\0b", 3)));
  EXPECT_TRUE(IsValidUtf8("\xC2\x80"));          // U+0080
  EXPECT_TRUE(IsValidUtf8("\xE0\xA0\x80"));      // U+0800
  EXPECT_TRUE(IsValidUtf8("\xED\x9F\xBF"));      // U+D7FF, just below the surrogates
  EXPECT_TRUE(IsValidUtf8("\xEE\x80\x80"));      // U+E000, just above them
  EXPECT_TRUE(IsValidUtf8("\xF0\x90\x80\x80"));  // U+10000
  EXPECT_TRUE(IsValidUtf8("\xF4\x8F\xBF\xBF"));  // U+10FFFF
  EXPECT_TRUE(IsValidUtf8("long ascii run then \xE4\xBD\xA0"));
}

TEST(Utf8Test, RejectsOverlongsSurrogatesAndTruncation) {
  for (const char* bad : {
           "\x80",              // lone continuation
           "\xC0\x80",          // overlong NUL
           "\xC1\xBF",          // overlong ASCII
           "\xE0\x9F\xBF",      // overlong 3-byte
           "\xF0\x8F\xBF\xBF",  // overlong 4-byte
           "\xED\xA0\x80",      // U+D800
           "\xED\xBF\xBF",      // U+DFFF
           "\xF4\x90\x80\x80",  // U+110000
           "\xF5\x80\x80\x80",  // invalid lead
           "\xFF",              // invalid byte
           "\xE4\xBD",          // truncated
           "abcdefgh\xE4",      // truncated after an ASCII block
           "\xC3\x28",          // bad continuation
       }) {
    EXPECT_FALSE(IsValidUtf8(bad)) << testing::PrintToString(std::string(bad));
  }
}

TEST(Utf8Test, ToValidUtf8ReplacesMaximalSubparts) {
  EXPECT_EQ(ToValidUtf8("ok"), "ok");
  EXPECT_EQ(ToValidUtf8("a\xFF"
                        "b"),
            "a\xEF\xBF\xBD"
            "b");
  // A truncated 3-byte sequence is one subpart; a surrogate is three (its lead is only valid
  // with a second byte below 0xA0).
  EXPECT_EQ(ToValidUtf8("\xE4\xBD"
                        "x"),
            "\xEF\xBF\xBD"
            "x");
  EXPECT_EQ(ToValidUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(ToValidUtf8("\xF0\x9F\x98"), "\xEF\xBF\xBD");
}

TEST(Utf8Test, NfcComposesAcrossRegionBoundaries) {
  using tokenizer_internal::Nfc;
  // Expected values are Python's unicodedata.normalize("NFC", ...).
  EXPECT_EQ(Nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(Nfc("x\u4e2de\u0301y"), "x\u4e2d\u00e9y");
  EXPECT_EQ(Nfc("\u1100\u1161\u11a8"), "\uac01");                   // Hangul jamo
  EXPECT_EQ(Nfc("a\u0301\u0323b"), "\u1ea1\u0301b");                // reordered, then composed
  EXPECT_EQ(Nfc("\u4e2d\u0301"), "\u4e2d\u0301");                   // nothing to compose with
  EXPECT_EQ(Nfc("\u304b\u3099\u304b"), "\u304c\u304b");             // kana + voicing mark
  EXPECT_EQ(Nfc("Ae\u0301\u0301 \u212b"), "A\u00e9\u0301 \u00c5");  // singleton Angstrom
  EXPECT_EQ(Nfc(std::string("a\0b", 3)), std::string("a\0b", 3));
}

}  // namespace
}  // namespace tandem
