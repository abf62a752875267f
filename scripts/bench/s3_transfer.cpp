// One checkpoint folder copied between a local root and an S3 bucket by gpurun's own code,
// CheckpointStore::copy_from(from, NAME), as gpurun moves checkpoints to and from a bucket: the
// background upload of a save from the local tier to `--ckpt s3://...` (upload), and a resume
// onto an empty disk, which fetches the newest checkpoint from the bucket (download). Either way
// every file is streamed, checked against the source's manifest (size and xxh3) as its bytes
// pass, and committed with the manifest last, then LATEST; an upload sends each file as a
// multipart upload of 8 MiB parts, 4 in flight, each with Content-MD5 (S3ClientOptions), the
// source read in 8 MiB chunks; a download fetches ranged GETs of 8 MiB, 4 at a time, into files
// written with an fsync of every file and of the folder.
//
// Measured in this process, one copy per process: the seconds of copy_from() end to end (the
// storages are opened before; their first request opens the connections, inside the time), and
// the host memory the copy holds: the peak resident memory during it (VmHWM, reset to the
// current resident size through /proc/self/clear_refs just before) minus the resident memory
// before it (VmRSS). The page cache that reading or writing the files fills is the kernel's, not
// the process's. scripts/bench/s3.sh runs it against boto3 on the same files.
//
// Usage: gpurun_bench_s3 upload LOCAL_ROOT NAME s3://BUCKET/PREFIX
//        gpurun_bench_s3 download s3://BUCKET/PREFIX NAME LOCAL_ROOT
//   NAME: a checkpoint folder of the source root (ckpt-e0001-s0000030); the destination root
//   must not hold one of that name (copy_from() keeps a complete one: nothing would be copied).
//   The bucket's settings come from the environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
//   AWS_SECRET_ACCESS_KEY, AWS_REGION; s3/s3_settings.h).
//   prints "seconds S", "bytes N" (the data files' bytes, manifest excluded), "rss_before_bytes N",
//   "peak_above_bytes N"
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <string>

#include "checkpoint/storage/checkpoint_storage.h"
#include "checkpoint/storage/store.h"
#include "proc_status.h"

namespace {

using gpurun::bench::status_bytes;

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc != 5 || (mode != "upload" && mode != "download")) {
    std::fprintf(stderr,
                 "usage: %s upload LOCAL_ROOT NAME s3://BUCKET/PREFIX\n"
                 "       %s download s3://BUCKET/PREFIX NAME LOCAL_ROOT\n",
                 argv[0], argv[0]);
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  try {
    const std::shared_ptr<gpurun::CheckpointStorage> from = gpurun::open_storage(argv[2]);
    const std::string name = argv[3];
    // keep_last far above what the destination holds: retention removes nothing.
    gpurun::CheckpointStore to(argv[4], 1000);
    const long long before = status_bytes("VmRSS");
    std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS (Linux >= 4.0)
    const auto start = std::chrono::steady_clock::now();
    const gpurun::SaveResult result = to.copy_from(*from, name);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const long long peak = status_bytes("VmHWM");
    std::printf("seconds %.6f\nbytes %lld\nrss_before_bytes %lld\npeak_above_bytes %lld\n", seconds,
                static_cast<long long>(result.bytes), before, peak - before);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
  return 0;
}
