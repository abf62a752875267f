// manifest.json as a resume, `gpurun ckpt` and `gpurun export` read it (store.h): the
// checkpoint folder is examined with its checksums (manifest parsed, every file it lists
// checked), listed as a checkpoint root, and a manifest that verifies is turned into the
// run's metadata and its config, as a resume does. Input: the bytes of manifest.json; the
// folder also holds a small model.pt (kModelPt below) for the manifest to name. The folder is
// named after the seeds' epoch 1 and global step 8, which its manifest must agree with; the
// seeds are of format_version 1 (no seal) and 2 (complete_sealed.json).
#include <filesystem>

#include <nlohmann/json.hpp>

#include "checkpoint/storage/store.h"
#include "fuzz_util.h"
#include "gpurun/config.h"

namespace {
// The seed manifests name it with its size and xxh3, as a real one names model.pt.
constexpr const char* kModelPt = "gpurun fuzz model.pt\n";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string folder = [] {
    const std::string f = gpurun::fuzz::scratch_dir() + "/ckpt-e0001-s0000008";
    std::filesystem::create_directories(f);
    gpurun::fuzz::write_file(f + "/model.pt", kModelPt);
    return f;
  }();
  gpurun::fuzz::write_file(folder + "/manifest.json", data, size);
  gpurun::fuzz::expect_gpurun_errors([&] {
    gpurun::CheckpointInfo info = gpurun::CheckpointView::inspect(folder, /*verify=*/true);
    (void)gpurun::CheckpointView(gpurun::fuzz::scratch_dir()).list(/*verify=*/false);
    if (!info.complete) return;
    gpurun::LoadedCheckpoint loaded{info, gpurun::meta_from_manifest(info.manifest), {}};
    (void)loaded.expected("model.pt");
    (void)gpurun::config_from_json(loaded.meta.config);
  });
  return 0;
}
