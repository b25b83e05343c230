#include "worker/model/checkpoint/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/model/checkpoint/temp_dir.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// An image with the given header text and data section; the length prefix is little-endian.
std::string MakeImage(const std::string& header, const std::string& data = "",
                      uint64_t declared_length = UINT64_MAX) {
  const uint64_t length = declared_length == UINT64_MAX ? header.size() : declared_length;
  std::string image(8, '\0');
  for (int i = 0; i < 8; ++i) image[static_cast<size_t>(i)] = static_cast<char>(length >> (8 * i));
  return image + header + data;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string ErrorOf(const std::string& image, const std::string& origin = "test.safetensors") {
  auto parsed = SafetensorsFile::Parse(Bytes(image), origin);
  EXPECT_FALSE(parsed.ok()) << "expected an error for header " << image.substr(8);
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

std::vector<float> ToF32(const TensorView& view) {
  std::vector<float> out(static_cast<size_t>(view.NumElements()));
  EXPECT_TRUE(ConvertToF32(view.dtype, view.data.data(), out.size(), out.data()).ok());
  return out;
}

class RoundTripTest : public ::testing::TestWithParam<DType> {};

TEST_P(RoundTripTest, WriteThenOpenPreservesNamesShapesAndValues) {
  const DType dtype = GetParam();
  test::TempDir dir;
  const std::vector<float> matrix = {1.0f, -2.5f, 0.1f, 65504.0f, -1e-6f, 3.0f};
  const std::vector<float> scalar = {42.0f};
  const std::vector<TensorToWrite> tensors = {
      {"z.weight", {2, 3}, matrix},
      {"a.scalar", {}, scalar},
      {"m.empty", {0, 4}, {}},
  };
  const std::string path = dir.File("t.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, dtype).ok());

  // The data section starts 8-byte aligned, like the reference writer's output.
  const std::string raw = ReadFile(path);
  uint64_t header_length = 0;
  std::memcpy(&header_length, raw.data(), 8);
  EXPECT_EQ(header_length % 8, 0u);

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), path);
  ASSERT_EQ((*file)->tensors().size(), 3u);
  EXPECT_TRUE((*file)->metadata().empty());

  const TensorView* weight = (*file)->Find("z.weight");
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(weight->name, "z.weight");
  EXPECT_EQ(weight->dtype, dtype);
  EXPECT_EQ(weight->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(weight->NumElements(), 6);
  EXPECT_EQ(weight->data.size(), 6 * DTypeSize(dtype));
  std::vector<float> expected = matrix;
  for (float& v : expected) {
    if (dtype == DType::kF16) v = F16BitsToF32(F32ToF16Bits(v));
    if (dtype == DType::kBF16) v = BF16BitsToF32(F32ToBF16Bits(v));
  }
  EXPECT_EQ(ToF32(*weight), expected);

  const TensorView* s = (*file)->Find("a.scalar");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->NumElements(), 1);
  EXPECT_EQ(ToF32(*s), std::vector<float>{42.0f});

  const TensorView* empty = (*file)->Find("m.empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->NumElements(), 0);
  EXPECT_TRUE(empty->data.empty());
  EXPECT_EQ((*file)->Find("missing"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RoundTripTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(WriteSafetensorsTest, RejectsBadInput) {
  test::TempDir dir;
  const std::vector<float> three = {1, 2, 3};
  const std::string path = dir.File("x.safetensors");
  std::vector<TensorToWrite> wrong_count = {{"a", {2, 2}, three}};
  EXPECT_FALSE(WriteSafetensors(path, wrong_count, DType::kF32).ok());
  std::vector<TensorToWrite> dup = {{"a", {3}, three}, {"a", {3}, three}};
  EXPECT_FALSE(WriteSafetensors(path, dup, DType::kF32).ok());
  std::vector<TensorToWrite> ok = {{"a", {3}, three}};
  EXPECT_FALSE(WriteSafetensors(path, ok, DType::kI32).ok());
  EXPECT_FALSE(WriteSafetensors(dir.File("no/such/dir.safetensors"), ok, DType::kF32).ok());
}

TEST(SafetensorsParseTest, AcceptsMetadataUnalignedHeaderAndOtherDtypes) {
  // 3 F64 values and 2 I32 values; a header length that is not a multiple of 8 leaves the data
  // unaligned, which readers must tolerate.
  const double doubles[3] = {1.5, -2.0, 1e-3};
  const int32_t ints[2] = {7, -9};
  std::string data(reinterpret_cast<const char*>(doubles), sizeof(doubles));
  data.append(reinterpret_cast<const char*>(ints), sizeof(ints));
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"d":{"dtype":"F64","shape":[3],"data_offsets":[0,24]},)"
      R"("i":{"dtype":"I32","shape":[1,2],"data_offsets":[24,32]}})";
  ASSERT_NE(header.size() % 8, 0u);
  const std::string image = MakeImage(header, data);
  auto file = SafetensorsFile::Parse(Bytes(image), "mem");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ(ToF32(*(*file)->Find("d")), (std::vector<float>{1.5f, -2.0f, 1e-3f}));
  const TensorView* i = (*file)->Find("i");
  ASSERT_NE(i, nullptr);
  EXPECT_EQ(i->dtype, DType::kI32);
  int32_t second = 0;
  std::memcpy(&second, i->data.data() + 4, 4);
  EXPECT_EQ(second, -9);
}

TEST(SafetensorsParseTest, EmptyHeaderObjectHasNoTensors) {
  auto file = SafetensorsFile::Parse(Bytes(MakeImage("{}")), "mem");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->tensors().empty());
}

TEST(SafetensorsParseTest, AllowsGapsButNotOverlaps) {
  const std::string data(32, '\0');
  auto gap = SafetensorsFile::Parse(
      Bytes(MakeImage(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})",
                      data)),
      "mem");
  EXPECT_TRUE(gap.ok()) << gap.status();
  const std::string overlap =
      ErrorOf(MakeImage(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                        data));
  EXPECT_THAT(overlap, AllOf(HasSubstr("'a'"), HasSubstr("'b'"), HasSubstr("overlap")));
  // An empty tensor sitting inside another's range shares no bytes.
  auto empty_inside = SafetensorsFile::Parse(
      Bytes(MakeImage(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                      R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                      data)),
      "mem");
  EXPECT_TRUE(empty_inside.ok()) << empty_inside.status();
}

struct MalformedCase {
  const char* name;
  std::string image;
  std::vector<std::string> message_parts;  // each must appear in the error
};

std::vector<MalformedCase> MalformedCases() {
  const std::string data(16, '\0');
  auto tensor = [](const std::string& body) { return "{\"w\":" + body + "}"; };
  return {
      {"too_short", std::string(5, '\0'), {"too short"}},
      {"header_past_end", MakeImage("{}", "", 1000), {"runs past the end"}},
      {"header_too_long", MakeImage("{}", "", 200'000'000), {"exceeds the limit"}},
      {"header_length_huge", MakeImage("{}", "", 0xffffffffffffff00ull), {"exceeds the limit"}},
      {"bad_json", MakeImage("{\"w\": [1, 2", data), {"not valid JSON"}},
      {"json_array", MakeImage("[1,2,3]", data), {"not a JSON object"}},
      {"json_string", MakeImage("\"hello\"", data), {"not a JSON object"}},
      {"invalid_utf8", MakeImage("{\"\xff\xfe\":1}", data), {"not valid JSON"}},
      {"metadata_not_object", MakeImage(R"({"__metadata__":[1]})", data), {"__metadata__"}},
      {"metadata_value_not_string",
       MakeImage(R"({"__metadata__":{"a":1}})", data),
       {"__metadata__", "\"a\""}},
      {"entry_not_object", MakeImage(tensor("5"), data), {"'w'", "not a JSON object"}},
      {"missing_dtype",
       MakeImage(tensor(R"({"shape":[1],"data_offsets":[0,4]})"), data),
       {"'w'", "dtype"}},
      {"missing_shape",
       MakeImage(tensor(R"({"dtype":"F32","data_offsets":[0,4]})"), data),
       {"'w'", "shape"}},
      {"missing_offsets",
       MakeImage(tensor(R"({"dtype":"F32","shape":[1]})"), data),
       {"'w'", "data_offsets"}},
      {"bad_dtype",
       MakeImage(tensor(R"({"dtype":"Q4_K","shape":[1],"data_offsets":[0,4]})"), data),
       {"'w'", "Q4_K"}},
      {"dtype_not_string",
       MakeImage(tensor(R"({"dtype":3,"shape":[1],"data_offsets":[0,4]})"), data),
       {"'w'", "dtype"}},
      {"negative_dim",
       MakeImage(tensor(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"), data),
       {"'w'", "shape"}},
      {"float_dim",
       MakeImage(tensor(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})"), data),
       {"'w'", "shape"}},
      {"numel_overflow",
       MakeImage(
           tensor(R"({"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]})"),
           data),
       {"'w'", "overflow"}},
      {"offsets_out_of_range",
       MakeImage(tensor(R"({"dtype":"F32","shape":[8],"data_offsets":[0,32]})"), data),
       {"'w'", "outside the data section"}},
      {"offsets_huge",
       MakeImage(
           tensor(
               R"({"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]})"),
           data),
       {"'w'"}},
      {"offsets_reversed",
       MakeImage(tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})"), data),
       {"'w'", "reversed"}},
      {"offsets_three",
       MakeImage(tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})"), data),
       {"'w'", "data_offsets"}},
      {"offsets_negative",
       MakeImage(tensor(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})"), data),
       {"'w'", "data_offsets"}},
      {"wrong_size",
       MakeImage(tensor(R"({"dtype":"BF16","shape":[2,2],"data_offsets":[0,16]})"), data),
       {"'w'", "byte size 16", "BF16", "[2, 2]", "8 bytes"}},
  };
}

TEST(SafetensorsParseTest, EveryMalformedHeaderIsAnErrorNamingFileAndTensor) {
  for (const MalformedCase& c : MalformedCases()) {
    SCOPED_TRACE(c.name);
    const std::string message = ErrorOf(c.image, "bad/model.safetensors");
    EXPECT_THAT(message, HasSubstr("bad/model.safetensors"));
    for (const std::string& part : c.message_parts) EXPECT_THAT(message, HasSubstr(part));
  }
}

std::string ValidImage() {
  test::TempDir dir;
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const std::vector<float> b = {7, 8};
  const std::vector<TensorToWrite> tensors = {{"a", {2, 3}, a}, {"b", {2}, b}};
  EXPECT_TRUE(WriteSafetensors(dir.File("v.safetensors"), tensors, DType::kBF16).ok());
  return ReadFile(dir.File("v.safetensors"));
}

TEST(SafetensorsParseTest, EveryTruncationOfAValidFileIsAnError) {
  const std::string image = ValidImage();
  ASSERT_TRUE(SafetensorsFile::Parse(Bytes(image), "full").ok());
  for (size_t length = 0; length < image.size(); ++length) {
    auto parsed = SafetensorsFile::Parse(Bytes(image.substr(0, length)), "cut");
    EXPECT_FALSE(parsed.ok()) << "prefix of " << length << " bytes parsed";
  }
}

// Random corruption must give an error or a consistent file, never a crash or an out-of-range
// view (the views are checked against the buffer here).
TEST(SafetensorsParseTest, RandomCorruptionNeverYieldsViewsOutsideTheBuffer) {
  const std::string image = ValidImage();
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string mutated = image;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      mutated[rng() % mutated.size()] = static_cast<char>(rng() & 0xff);
    }
    auto parsed = SafetensorsFile::Parse(Bytes(mutated), "fuzz");
    if (!parsed.ok()) continue;
    const std::byte* begin = reinterpret_cast<const std::byte*>(mutated.data());
    for (const auto& [name, view] : (*parsed)->tensors()) {
      ASSERT_GE(view.data.data(), begin);
      ASSERT_LE(view.data.data() + view.data.size(), begin + mutated.size());
      ASSERT_EQ(view.data.size(), static_cast<size_t>(view.NumElements()) * DTypeSize(view.dtype));
    }
  }
}

TEST(SafetensorsOpenTest, TruncatedFileIsAnErrorNamingTheFile) {
  test::TempDir dir;
  const std::string image = ValidImage();
  const std::string path = dir.Write("model.safetensors", image.substr(0, image.size() - 3));
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), AllOf(HasSubstr(path), HasSubstr("truncated")));
}

TEST(SafetensorsOpenTest, MissingEmptyAndDirectoryPathsAreErrors) {
  test::TempDir dir;
  auto missing = SafetensorsFile::Open(dir.File("nope.safetensors"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("nope.safetensors"));
  auto empty = SafetensorsFile::Open(dir.Write("empty.safetensors", ""));
  EXPECT_FALSE(empty.ok());
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("empty.safetensors"));
  EXPECT_FALSE(SafetensorsFile::Open(dir.path().string()).ok());
}

// A file written by the reference Python implementation
// (tools/fixtures/make_safetensors_fixtures.py).
TEST(SafetensorsOpenTest, ReadsReferenceWriterOutput) {
  const std::string path =
      std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/safetensors/reference.safetensors";
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  const std::vector<float> ramp = {-1.5f, -0.5f, 0.0f, 0.25f, 1.0f, 3.0f};
  for (const char* name : {"ramp_f32", "ramp_f16", "ramp_bf16", "ramp_f64"}) {
    const TensorView* view = (*file)->Find(name);
    ASSERT_NE(view, nullptr) << name;
    EXPECT_EQ(view->shape, (std::vector<int64_t>{2, 3})) << name;
    EXPECT_EQ(ToF32(*view), ramp) << name;  // every ramp value is exact in every dtype
  }
  const TensorView* ids = (*file)->Find("ids_i64");
  ASSERT_NE(ids, nullptr);
  EXPECT_EQ(ids->dtype, DType::kI64);
  int64_t last = 0;
  std::memcpy(&last, ids->data.data() + 8 * 3, 8);
  EXPECT_EQ(last, -7);
}

}  // namespace
}  // namespace tandem
