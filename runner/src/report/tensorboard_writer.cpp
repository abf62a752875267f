#include "report/tensorboard_writer.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "report/file_writer.h"
#include "report/tensorboard_event.pb.h"
#include "util/clock.h"
#include "util/crc32c.h"
#include "util/fs.h"
#include "util/text.h"

namespace gpurun {
namespace {

namespace tb = gpurun::tensorboard;

constexpr const char* kFilePrefix = "events.out.tfevents.";

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

/// fields[key] when it is a finite number.
bool number(const nlohmann::json& fields, const char* key, double& out) {
  auto it = fields.find(key);
  if (it == fields.end() || !it->is_number()) return false;
  out = it->get<double>();
  return std::isfinite(out);
}

/// The largest <seconds> among the event files in `dir` (0 when none): a new file's name must
/// sort after them, even when the previous process started within the same second.
int64_t newest_file_seconds(const std::string& dir) {
  int64_t newest = 0;
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (!starts_with(name, kFilePrefix)) continue;
    newest =
        std::max<int64_t>(newest, std::strtoll(name.c_str() + strlen(kFilePrefix), nullptr, 10));
  }
  closedir(d);
  return newest;
}

std::string serialized(const tb::Event& event) {
  std::string payload;
  event.SerializeToString(&payload);
  return tfrecord(payload);
}

}  // namespace

std::string tfrecord(const std::string& payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  put_u64(out, payload.size());
  put_u32(out, masked_crc32c(out.data(), 8));
  out += payload;
  put_u32(out, masked_crc32c(payload.data(), payload.size()));
  return out;
}

ScalarRecord scalars_of_event(const nlohmann::json& line, double capacity_bytes) {
  ScalarRecord r;
  if (!line.is_object()) return r;
  const std::string name = line.value("event", std::string());
  double v = 0;
  if (number(line, "time", v)) r.wall_time = v;
  if (number(line, "global_step", v)) r.step = static_cast<int64_t>(v);
  auto add = [&](const char* key, const char* tag) {
    double x = 0;
    if (number(line, key, x)) r.values.emplace_back(tag, x);
  };
  // A loss that is not a number (JSON writes NaN and infinity as null): TensorBoard shows NaN.
  auto add_loss = [&](const char* key, const char* tag) {
    auto it = line.find(key);
    if (it != line.end() && it->is_null())
      r.values.emplace_back(tag, std::nan(""));
    else
      add(key, tag);
  };
  if (name == "step") {
    add_loss("loss", "train/loss");
    add("lr", "train/lr");
    add("samples_per_second", "train/samples_per_second");
    add("data_wait_seconds", "train/data_wait_seconds");
    add("loss_scale", "train/loss_scale");
  } else if (name == "epoch") {
    add_loss("train_loss", "train/epoch_loss");
    add("eval_loss", "eval/loss");  // null also when there is no evaluation set
    add("eval_accuracy", "eval/accuracy");
    add("peak_bytes", "memory/peak_bytes");
    add("eval_data_wait_seconds", "eval/data_wait_seconds");
    if (!r.values.empty() && capacity_bytes > 0)
      r.values.emplace_back("memory/capacity_bytes", capacity_bytes);
  } else if (name == "plan") {
    r.step += 1;  // the first step the plan applies to (header)
    add("measured_peak_bytes", "memory/measured_peak_bytes");
    add("estimated_peak_bytes", "memory/estimated_peak_bytes");
    add("capacity_bytes", "memory/capacity_bytes");
    add("micro_batch", "plan/micro_batch");
    add("accumulation_steps", "plan/accumulation_steps");
  } else if (name == "checkpoint") {
    add("stall_seconds", "checkpoint/stall_seconds");
    add("write_seconds", "checkpoint/write_seconds");
    add("bytes", "checkpoint/bytes");
  } else if (name == "checkpoint_copied") {
    add("write_seconds", "checkpoint/copy_seconds");
  }
  return r;
}

TensorBoardWriter::TensorBoardWriter(std::string dir, BackgroundFileWriter& files)
    : dir_(std::move(dir)), files_(files) {}

bool TensorBoardWriter::open(double wall_time) {
  try {
    fs::make_dirs(dir_);
    const int64_t seconds =
        std::max(static_cast<int64_t>(wall_time), newest_file_seconds(dir_) + 1);
    path_ = fmt::format("{}/{}{:010d}.{}.{}.gpurun", dir_, kFilePrefix, seconds, host_name(),
                        static_cast<int64_t>(getpid()));
  } catch (const std::exception& e) {
    spdlog::warn("no TensorBoard files: {}; training goes on", e.what());
    off_ = true;
    return false;
  }
  tb::Event version;
  version.set_wall_time(wall_time);
  version.set_file_version("brain.Event:2");
  files_.append_bytes(path_, serialized(version));
  return true;
}

void TensorBoardWriter::record(const nlohmann::json& line) {
  if (off_) return;
  try {
    const ScalarRecord r = scalars_of_event(line, capacity_bytes_);
    const bool plan = line.value("event", std::string()) == "plan";
    if (plan) number(line, "capacity_bytes", capacity_bytes_);
    if (r.values.empty() && !(plan && !started_)) return;
    if (path_.empty() && !open(r.wall_time)) return;
    std::string records;
    if (plan && !started_) {
      started_ = true;
      tb::Event start;
      start.set_wall_time(r.wall_time);
      start.set_step(r.step);
      start.mutable_session_log()->set_status(tb::SessionLog::START);
      records += serialized(start);
    }
    if (!r.values.empty()) {
      tb::Event event;
      event.set_wall_time(r.wall_time);
      event.set_step(r.step);
      for (const auto& [tag, value] : r.values) {
        tb::Summary::Value* v = event.mutable_summary()->add_value();
        v->set_tag(tag);
        v->set_simple_value(static_cast<float>(value));
      }
      records += serialized(event);
    }
    files_.append_bytes(path_, records);
  } catch (const std::exception& e) {
    spdlog::warn("TensorBoard files off: {}; training goes on", e.what());
    off_ = true;
  }
}

}  // namespace gpurun
