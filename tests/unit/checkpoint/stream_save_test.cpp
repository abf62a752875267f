// Streamed checkpoint saves (docs/architecture.md, "Checkpoint saves"): HostStateCopy::build()
// gives the store sources that serialize model.pt, optim.pt and trainer.pt as they are written,
// every tensor's bytes straight from its host buffer, hashed as they pass. The files are those
// of an in-memory save byte for byte, load in Python with weights_only=True, their manifest
// checksums match a re-read, the save holds no image of a file, and a write that fails half way
// leaves the previous checkpoint as it was.
#include <signal.h>
#include <sys/resource.h>

#include <ATen/core/Dict.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/format/state_copy.h"
#include "checkpoint/format/train_state.h"
#include "checkpoint/storage/store.h"
#include "common/temp_dir.h"
#include "gpurun/errors.h"
#include "gpurun/model.h"
#include "util/fs.h"
#include "util/hash.h"

namespace gpurun {
namespace {

namespace stdfs = std::filesystem;
using test::TempDir;

/// A model of `width` x `width` and `width` x 10 weights, with Adam's state after one step (so
/// optim.pt holds exp_avg and exp_avg_sq of every parameter).
struct Trained {
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Adam> optimizer;

  explicit Trained(int64_t width) {
    torch::manual_seed(3);
    model = torch::nn::Sequential(torch::nn::Linear(width, width), torch::nn::ReLU(),
                                  torch::nn::Linear(width, 10));
    optimizer =
        std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-3));
    model->forward(torch::randn({4, width})).square().sum().backward();
    optimizer->step();
  }
};

CheckpointMeta meta_of_step(int64_t step) {
  CheckpointMeta meta;
  meta.global_step = step;
  meta.config = nlohmann::json::object();
  return meta;
}

/// A streamed snapshot of `t`, as a trainer's save hands it to the writer.
CheckpointSnapshot streamed_snapshot(HostStateCopy& copy, const Trained& t, int64_t step) {
  copy.copy(*t.model, *t.optimizer, trainer_rng_states(*t.model));
  CheckpointSnapshot snapshot;
  snapshot.meta = meta_of_step(step);
  copy.build(snapshot);
  return snapshot;
}

std::string run_python(const std::string& script, const std::vector<std::string>& args) {
  std::string command = std::string(GPURUN_PYTHON) + " -c '" + script + "'";
  for (const auto& a : args) command += " '" + a + "'";
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string output;
  char buf[512];
  while (pipe && std::fgets(buf, sizeof buf, pipe)) output += buf;
  const int status = pipe ? pclose(pipe) : -1;
  EXPECT_EQ(status, 0) << command << "\n" << output;
  return output;
}

/// VmRSS or VmHWM of this process, in bytes.
int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return -1;
}

TEST(WriteStreamed, WritesEveryPieceInOrderAndObservesWhatItWrites) {
  TempDir dir;
  std::vector<std::string> pieces;
  for (const size_t size : {size_t{0}, size_t{3}, (size_t{1} << 20) - 1, size_t{1} << 20,
                            size_t{9} << 20, size_t{17}, size_t{100000}}) {
    std::string piece(size, '\0');
    for (size_t i = 0; i < size; ++i) piece[i] = static_cast<char>(i * 31 + pieces.size());
    pieces.push_back(piece);
  }
  std::string expected, observed;
  int resets = 0;
  const int64_t n = fs::write_streamed(
      dir / "f",
      [&](const ByteSink& out) {
        for (const auto& p : pieces) out(p.data(), p.size());
      },
      [&](const char* data, size_t size) { observed.append(data, size); },
      [&] {
        observed.clear();
        ++resets;
      });
  for (const auto& p : pieces) expected += p;
  EXPECT_EQ(n, static_cast<int64_t>(expected.size()));
  EXPECT_EQ(resets, 1);
  EXPECT_TRUE(observed == expected);
  EXPECT_TRUE(fs::read_file(dir / "f") == expected);
}

// A transient error (EIO on network storage) half way through a file: the whole file is
// written again from its source, and the checksum, started over, is that of the file on disk.
TEST(WriteStreamed, ATransientErrorWritesTheFileAgainFromItsSource) {
  TempDir dir;
  CheckpointStore store(dir / "ckpt", 2);
  CheckpointSnapshot snapshot;
  snapshot.meta = meta_of_step(1);
  const std::string bytes(3 << 20, 'x');
  int runs = 0;
  snapshot.streamed.emplace_back("model.pt", [&](const ByteSink& out) {
    out(bytes.data(), bytes.size() / 2);
    if (++runs == 1) throw IoError("write", "model.pt", EIO);
    out(bytes.data() + bytes.size() / 2, bytes.size() - bytes.size() / 2);
  });
  const SaveResult saved = store.save(snapshot);
  EXPECT_EQ(runs, 2);
  const auto [size, xxh3] = store.load(saved.path).expected("model.pt");
  EXPECT_EQ(size, static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(xxh3, xxh3_hex(bytes));
}

/// The archive of `tensors` as gpurun wrote it into memory before saves were streamed:
/// LibTorch's torch::jit::writeArchiveAndTensors() of an untagged pickle of the dict.
std::string reference_archive(const NamedTensors& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor);
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) { pickled.insert(pickled.end(), data, data + size); },
      nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  std::string archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    archive.append(static_cast<const char*>(data), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return archive;
}

// The archive's records arrive at the sink from the tensors' own memory, each in one piece: no
// copy of a tensor is made to write it.
TEST(StreamedSave, EveryTensorRecordComesStraightFromItsStorage) {
  const NamedTensors tensors{{"a", at::arange(1 << 16, at::kFloat)}, {"b", at::ones({7, 3})}};
  std::map<const void*, size_t> pieces;
  std::string bytes;
  pickle_tensors(tensors, [&](const char* data, size_t size) {
    pieces[data] = size;
    bytes.append(data, size);
  });
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(pieces.count(t.data_ptr())) << name;
    EXPECT_EQ(pieces[t.data_ptr()], t.nbytes()) << name;
  }
  EXPECT_TRUE(bytes == pickle_tensors(tensors));
  EXPECT_TRUE(bytes == reference_archive(tensors)) << "not the bytes LibTorch's writer gives";
}

// What the file's sink throws (an IoError of the disk) comes out of the archive writers as it
// is, from a tensor's record or from the zip's directory alike, not as LibTorch's error.
TEST(StreamedSave, TheSinksErrorComesBackAsItIsFromAnyPointOfTheArchive) {
  const Trained t(64);
  HostStateCopy copy;
  CheckpointSnapshot snapshot = streamed_snapshot(copy, t, 1);
  for (const auto& [name, source] : snapshot.streamed) {
    size_t total = 0;
    source([&](const char*, size_t size) { total += size; });
    for (const size_t fail_at : {size_t{0}, size_t{100}, total / 2, total - 1}) {
      size_t seen = 0;
      try {
        source([&](const char*, size_t size) {
          if (seen + size > fail_at) throw IoError("write", name, ENOSPC);
          seen += size;
        });
        ADD_FAILURE() << name << ": no error at byte " << fail_at;
      } catch (const IoError& e) {
        EXPECT_EQ(e.error_number(), ENOSPC) << name << " at byte " << fail_at;
      }
    }
  }
}

// The streamed files are byte for byte those of the same copy built into memory, and model.pt
// and trainer.pt those of capture_state() (optim.pt names parameters by the address of the host
// optimizer's placeholders, which differ from copy to copy), their manifest's sizes and checksums
// are those of the files read back, Python's torch.load with weights_only=True reads model.pt and
// trainer.pt, and restore_state() brings back the model and the optimizer.
TEST(StreamedSave, FilesMatchTheirManifestLoadInPythonAndRestoreTheState) {
  TempDir dir;
  const Trained t(48);
  HostStateCopy copy;
  copy.keep_buffers(true);  // built twice
  CheckpointStore store(dir / "ckpt", 2);
  const SaveResult saved = store.save(streamed_snapshot(copy, t, 1));
  CheckpointSnapshot in_memory;
  copy.build(in_memory);
  in_memory.materialize();
  ASSERT_TRUE(in_memory.streamed.empty());
  const CheckpointSnapshot captured = capture_state(*t.model, *t.optimizer, meta_of_step(1));
  const LoadedCheckpoint loaded = store.load(saved.path);
  EXPECT_EQ(loaded.meta.model_digest, captured.meta.model_digest);
  EXPECT_EQ(loaded.meta.model_digest, model_digest(*t.model));
  ASSERT_EQ(in_memory.files.size(), 3u);
  for (size_t i = 0; i < in_memory.files.size(); ++i) {
    const auto& [name, bytes] = in_memory.files[i];
    const std::string on_disk = fs::read_file(saved.path + "/" + name);
    if (name != "trainer.pt") {  // the generators' states go to the first build() only
      EXPECT_TRUE(on_disk == bytes) << name << " differs from the in-memory build";
    }
    if (name != "optim.pt") {
      EXPECT_TRUE(on_disk == captured.files[i].second) << name << " differs from capture_state()";
    }
    const auto [size, xxh3] = loaded.expected(name);
    EXPECT_EQ(std::make_pair(size, xxh3), xxh3_file(saved.path + "/" + name)) << name;
  }

  const std::string script =
      "import sys, torch\n"
      "m = torch.load(sys.argv[1], weights_only=True)\n"
      "r = torch.load(sys.argv[2], weights_only=True)\n"
      "assert type(m) is dict and all(isinstance(v, torch.Tensor) for v in m.values())\n"
      "assert list(r) == [\"cpu_rng_state\"], list(r)\n"
      "torch.save(m, sys.argv[3])\n"
      "print(\"OK\", \",\".join(m))\n";
  const std::string out =
      run_python(script, {saved.path + "/model.pt", saved.path + "/trainer.pt", dir / "back.pt"});
  EXPECT_NE(out.find("OK 0.weight,0.bias,2.weight,2.bias"), std::string::npos) << out;
  const NamedTensors back = unpickle_tensors(fs::read_file(dir / "back.pt"), "back.pt");
  const NamedTensors live = state_dict(*t.model);
  ASSERT_EQ(back.size(), live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    EXPECT_EQ(back[i].first, live[i].first);
    EXPECT_TRUE(at::equal(back[i].second, live[i].second)) << live[i].first;
  }

  Trained fresh(48);
  torch::optim::Adam optimizer(fresh.model->parameters(), torch::optim::AdamOptions(1e-3));
  restore_state(loaded, *fresh.model, optimizer);
  EXPECT_EQ(model_digest(*fresh.model), model_digest(*t.model));
  const auto params = fresh.model->parameters();
  const auto live_params = t.model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& mine = static_cast<const torch::optim::AdamParamState&>(
        *optimizer.state().at(params[i].unsafeGetTensorImpl()));
    const auto& theirs = static_cast<const torch::optim::AdamParamState&>(
        *t.optimizer->state().at(live_params[i].unsafeGetTensorImpl()));
    EXPECT_TRUE(at::equal(mine.exp_avg(), theirs.exp_avg())) << i;
    EXPECT_TRUE(at::equal(mine.exp_avg_sq(), theirs.exp_avg_sq())) << i;
    EXPECT_EQ(mine.step(), theirs.step()) << i;
  }
}

// A save of 192 MiB of files (64 MiB of weights, Adam's 128 MiB) holds no image of a file: the
// process's peak resident memory during the build and the write stays within 64 MiB of what the
// model and the host copy already hold (the kernel's page cache is not the process's memory).
// Before streaming, the images alone took more than the files' size.
TEST(StreamedSave, HostMemoryAboveTheCopyStaysUnder64MiB) {
  std::ofstream clear("/proc/self/clear_refs");
  if (!clear) GTEST_SKIP() << "/proc/self/clear_refs cannot be written: VmHWM cannot be reset";
  TempDir dir;
  const Trained t(4096);
  HostStateCopy copy;
  copy.copy(*t.model, *t.optimizer, trainer_rng_states(*t.model));
  ASSERT_GE(copy.copied_bytes(), int64_t{190} << 20);
  CheckpointStore store(dir / "ckpt", 2);
  const int64_t before = status_bytes("VmRSS");
  clear << "5" << std::flush;  // VmHWM := VmRSS (Linux >= 4.0)
  ASSERT_TRUE(clear.good());
  ASSERT_LE(status_bytes("VmHWM"), before + (int64_t{4} << 20));
  CheckpointSnapshot snapshot;
  snapshot.meta = meta_of_step(1);
  copy.build(snapshot);
  const SaveResult saved = store.save(snapshot);
  const int64_t above = status_bytes("VmHWM") - before;
  EXPECT_GE(saved.bytes, int64_t{190} << 20);
  EXPECT_LE(above, int64_t{64} << 20)
      << "the save's peak was " << (above >> 20) << " MiB above the host copy, for "
      << (saved.bytes >> 20) << " MiB of files";
}

/// store.save(snapshot) with files limited to `limit` bytes (RLIMIT_FSIZE): the write that
/// crosses it fails with EFBIG, as one on a full disk fails with ENOSPC. Returns the errno.
int save_past_a_file_size_limit(CheckpointStore& store, const CheckpointSnapshot& snapshot,
                                rlim_t limit) {
  struct rlimit old_limit {};
  ::getrlimit(RLIMIT_FSIZE, &old_limit);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  struct rlimit small = old_limit;
  small.rlim_cur = limit;
  ::setrlimit(RLIMIT_FSIZE, &small);
  int err = 0;
  try {
    store.save(snapshot);
  } catch (const IoError& e) {
    err = e.error_number();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  return err;
}

// A write that fails in the middle of a tensor's record of model.pt, or of optim.pt, fails the
// save with the disk's error; the previous checkpoint and LATEST stay as they were, and no
// temporary is left. The same host copy then saves.
TEST(StreamedSave, AWriteThatFailsHalfWayLeavesThePreviousCheckpoint) {
  TempDir dir;
  const Trained t(512);  // model.pt about 1 MiB, optim.pt about 2 MiB
  HostStateCopy copy;
  CheckpointStore store(dir / "ckpt", 3);
  const SaveResult first = store.save(streamed_snapshot(copy, t, 1));
  const int64_t model_bytes = fs::file_size(first.path + "/model.pt");
  const int64_t optim_bytes = fs::file_size(first.path + "/optim.pt");
  const auto entries = [&] {
    std::vector<std::string> names;
    for (const auto& e : stdfs::directory_iterator(dir / "ckpt"))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> before = entries();
  // RLIMIT_FSIZE limits each file: half of model.pt, then between model.pt's and optim.pt's size.
  ASSERT_LT(model_bytes, optim_bytes);
  for (const int64_t limit : {model_bytes / 2, (model_bytes + optim_bytes) / 2}) {
    const CheckpointSnapshot second = streamed_snapshot(copy, t, 2);
    EXPECT_EQ(save_past_a_file_size_limit(store, second, static_cast<rlim_t>(limit)), EFBIG)
        << limit;
    EXPECT_EQ(entries(), before) << limit;
    EXPECT_EQ(fs::read_file(dir / "ckpt/LATEST"), checkpoint_name(0, 1) + "\n");
    EXPECT_EQ(store.load_latest()->info.global_step, 1);
  }
  store.save(streamed_snapshot(copy, t, 2));
  EXPECT_EQ(store.load_latest()->info.global_step, 2);
}

}  // namespace
}  // namespace gpurun
