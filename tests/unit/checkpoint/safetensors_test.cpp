// Unit tests of checkpoint/safetensors.h: a written file reads back bit for bit, and every
// kind of damage to a header is refused naming the file and the tensor (issue 41).
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>

#include <gtest/gtest.h>

#include "checkpoint/format/safetensors.h"
#include "common/temp_dir.h"
#include "gpurun/errors.h"
#include "util/fs.h"

namespace gpurun {
namespace {

using test::TempDir;

/// A safetensors file of `header` (JSON text) followed by `data_bytes` zero bytes.
std::string file_of(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

std::string refusal(const std::string& path) {
  try {
    SafetensorsFile file(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, WrittenTensorsReadBackBitForBitWithTheirDtypesAndShapes) {
  TempDir dir;
  const at::Tensor a = at::randn({3, 5});
  const at::Tensor b = at::randn({7}).to(at::kBFloat16);
  const at::Tensor c = at::arange(6, at::kLong).view({2, 3});
  const std::vector<at::Tensor> values{a, b, c};
  const int64_t bytes = write_safetensors(
      dir / "m.safetensors",
      {{"a", at::kFloat, {3, 5}}, {"b.weight", at::kBFloat16, {7}}, {"c", at::kLong, {2, 3}}},
      [&](size_t i) { return values[i]; }, {{"note", "x"}});
  SafetensorsFile file(dir / "m.safetensors");
  EXPECT_EQ(file.size(), bytes);
  EXPECT_EQ(file.metadata().at("format"), "pt");  // transformers' loader requires it
  EXPECT_EQ(file.metadata().at("note"), "x");
  ASSERT_EQ(file.entries().size(), 3u);
  EXPECT_TRUE(at::equal(file.view(*file.find("a")), a));
  EXPECT_TRUE(at::equal(file.view(*file.find("b.weight")), b));
  EXPECT_TRUE(at::equal(file.view(*file.find("c")), c));
  EXPECT_EQ(file.find("d"), nullptr);
  // The data begins 8-byte aligned, as the reference writer pads the header.
  EXPECT_EQ((file.size() - (15 * 4 + 7 * 2 + 6 * 8)) % 8, 0);
}

TEST(Safetensors, AValueThatDoesNotMatchItsSpecIsRefusedAndNoFileIsLeft) {
  TempDir dir;
  EXPECT_THROW(write_safetensors(dir / "m.safetensors", {{"a", at::kFloat, {2}}},
                                 [](size_t) { return at::randn({3}); }),
               std::invalid_argument);
  EXPECT_FALSE(fs::exists(dir / "m.safetensors"));
}

TEST(Safetensors, EveryDamagedHeaderIsRefusedNamingTheFileAndTheTensor) {
  TempDir dir;
  const auto check = [&](const std::string& name, const std::string& bytes,
                         const std::string& expected) {
    fs::replace_file(dir / name, bytes);
    const std::string message = refusal(dir / name);
    EXPECT_NE(message.find(dir / name), std::string::npos) << message;
    EXPECT_NE(message.find(expected), std::string::npos) << name << ": " << message;
  };
  check("short", "abc", "shorter than its header");
  check("length",
        file_of("{}", 0).replace(0, 8, std::string("\xff\xff\xff\x00\x00\x00\x00\x00", 8)),
        "its header says");
  check("json", file_of("{nope", 0), "not JSON");
  check("dtype", file_of(R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8),
        "tensor w: unknown dtype");
  check("past", file_of(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
        "tensor w: data_offsets [0,16] run past the end");
  check("count", file_of(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
        "tensor w: data_offsets [0,8] hold 8 bytes");
  check("overlap",
        file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                12),
        "overlap");
  check("shape", file_of(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
        "tensor w: shape");
  check("reversed", file_of(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
        "end before they begin");
  // A written file cut short: its last tensor ends past the end.
  write_safetensors(dir / "whole", {{"a", at::kFloat, {4}}, {"b", at::kFloat, {4}}},
                    [](size_t) { return at::randn({4}); });
  const std::string whole = fs::read_file(dir / "whole");
  check("cut", whole.substr(0, whole.size() - 5), "tensor b: data_offsets");
}

}  // namespace
}  // namespace gpurun
