#include "checkpoint/format/checkpoint_types.h"

#include <cstdio>

#include "checkpoint/format/folder.h"
#include "gpurun/errors.h"
#include "util/text.h"

namespace gpurun {

using json = nlohmann::json;
using namespace checkpoint_folder;

std::string checkpoint_name(int64_t epoch, int64_t global_step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "ckpt-e%04lld-s%07lld", static_cast<long long>(epoch),
                static_cast<long long>(global_step));
  return buf;
}

std::optional<CheckpointName> parse_checkpoint_name(const std::string& name) {
  long long epoch = 0, step = 0;
  if (std::sscanf(name.c_str(), "ckpt-e%lld-s%lld", &epoch, &step) != 2) return std::nullopt;
  return CheckpointName{epoch, step};
}

bool is_checkpoint_folder_name(const std::string& name) {
  return starts_with(name, "ckpt-") && name.find(".damaged") == std::string::npos;
}

bool LatestFile::names(const std::string& checkpoint) const {
  return state == State::kPresent && name == checkpoint;
}

std::string LatestFile::describe() const {
  switch (state) {
    case State::kMissing:
      return "LATEST is missing";
    case State::kUnreadable:
      return "LATEST cannot be read (" + error + ")";
    case State::kPresent:
      break;
  }
  if (name.empty()) return "LATEST is empty";
  return "LATEST names " + printable_quoted(name);
}

const std::string& LoadedCheckpoint::file(const std::string& name) const {
  for (const auto& [file_name, bytes] : files) {
    if (file_name == name) return bytes;
  }
  throw ResumeError("checkpoint " + info.name + " has no file " + name);
}

std::pair<int64_t, std::string> LoadedCheckpoint::expected(const std::string& name) const {
  const json* table = info.manifest.is_object() && info.manifest.contains("files")
                          ? &info.manifest.at("files")
                          : nullptr;
  if (!table || !table->is_object() || !table->contains(name))
    throw ResumeError("checkpoint " + info.path + " has no file " + name);
  FileEntry entry;
  if (std::string problem = parse_entry(name, table->at(name), entry); !problem.empty())
    throw ResumeError("checkpoint " + info.path + ": " + problem);
  return {entry.bytes, entry.xxh3};
}

const CheckpointInfo* CheckpointSummary::newest() const {
  if (!newer_damaged.empty()) return &newer_damaged.front();
  return newest_complete ? &*newest_complete : nullptr;
}

const CheckpointInfo* CheckpointSummary::lost() const {
  const int64_t complete = newest_complete ? newest_complete->global_step : -1;
  return !set_aside.empty() && set_aside.back().global_step > complete ? &set_aside.back()
                                                                       : nullptr;
}

std::string CheckpointSummary::describe() const {
  const std::string how = checksums ? "verified" : "sizes match; checksums not read";
  std::string text;
  if (!newer_damaged.empty()) {
    const CheckpointInfo& newest = newer_damaged.front();
    text = "DAMAGED: " + printable(newest.name) + " (" + printable(newest.problem) + ")";
    if (newer_damaged.size() > 1)
      text += " and " + std::to_string(newer_damaged.size() - 1) + " older";
    text += newest_complete
                ? "; a resume takes " + printable(newest_complete->name) + " (" + how + ")"
                : "; no checkpoint is complete";
  } else if (newest_complete) {
    text = printable(newest_complete->name) + " (" + how + ")";
  } else {
    text = "none";
  }
  if (const CheckpointInfo* newer = lost())
    text += "; " + printable(newer->name) + ", newer, was set aside as damaged";
  else if (!set_aside.empty())
    text += "; " + std::to_string(set_aside.size()) + " older set aside as damaged";
  return text;
}

void CheckpointSnapshot::materialize() {
  for (auto& [name, source] : streamed) {
    std::string bytes;
    source([&](const char* data, size_t size) { bytes.append(data, size); });
    files.emplace_back(std::move(name), std::move(bytes));
  }
  streamed.clear();
}

}  // namespace gpurun
