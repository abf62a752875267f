// model.pt and trainer.pt read back (checkpoint/pickle.h) when the archive and its pickle
// disagree. The fuzz target (tests/fuzz/pickle_fuzz.cpp) searches for such files at random; the
// cases here are the ones it found that must stay found.
#include "checkpoint/format/pickle.h"

#include <string>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>

#include "gpurun/errors.h"

namespace gpurun {
namespace {

/// `archive` written again with the record data/0 cut to its first `keep` bytes.
std::string with_first_storage_cut(const std::string& archive, size_t keep) {
  caffe2::serialize::PyTorchStreamReader in(std::make_shared<BytesReadAdapter>(archive));
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  for (const std::string& name : in.getAllRecords()) {
    if (name != "data.pkl" && name.rfind("data/", 0) != 0) continue;  // the writer adds the rest
    auto [record, size] = in.getRecord(name);
    writer.writeRecord(name, record.get(), name == "data/0" ? std::min(size, keep) : size);
  }
  writer.writeEndOfFile();
  return out;
}

TEST(Pickle, ATensorDictRoundTrips) {
  const at::Tensor w = at::arange(1000, at::kFloat);
  const NamedTensors back = unpickle_tensors(pickle_tensors({{"w", w}}), "model.pt");
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].first, "w");
  EXPECT_TRUE(at::equal(back[0].second, w));
}

// The pickle says 1000 floats; the archive's record holds 64 bytes. LibTorch's unpickler sizes
// the storage by the pickle, so a copy of the tensor read 3936 bytes past the record (found by
// Fuzz.pickle under ASan as a SEGV in the copy kernel). It is a damaged file, named.
TEST(Pickle, AStorageRecordShorterThanThePickleSaysIsADamagedFile) {
  const std::string cut =
      with_first_storage_cut(pickle_tensors({{"w", at::arange(1000, at::kFloat)}}), 64);
  try {
    unpickle_tensors(cut, "model.pt");
    FAIL() << "a storage of 64 bytes was read as 1000 floats";
  } catch (const DamagedCheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model.pt: tensor w:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("reach outside its storage of 64 bytes"),
              std::string::npos)
        << e.what();
  }
  // Cut to nothing: the record is empty, and so is what the tensor may read.
  EXPECT_THROW(unpickle_tensors(with_first_storage_cut(pickle_tensors({{"w", at::ones({3})}}), 0),
                                "model.pt"),
               DamagedCheckpointError);
}

}  // namespace
}  // namespace gpurun
