#include "report/file_writer.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>

#include "gpurun/errors.h"
#include "util/fs.h"

namespace gpurun {
namespace {

using Clock = std::chrono::steady_clock;

/// Seconds behind after which the storage counts as stalled.
constexpr double kStalledSeconds = 10;
/// Writes queued at most; more are dropped (and counted) until the storage catches up.
constexpr size_t kMaxQueued = 100000;

enum class Kind { kAppend, kReplace };

struct Op {
  Kind kind;
  std::string path, data;
  Clock::time_point queued;
};

}  // namespace

struct BackgroundFileWriter::Shared {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Op> queue;
  bool busy = false, stopping = false;
  bool warned_stall = false;
  int64_t dropped = 0;
  std::set<std::string> failed;  ///< paths warned about
};

BackgroundFileWriter::BackgroundFileWriter() : shared_(std::make_shared<Shared>()) {
  std::thread([s = shared_] { loop(s); }).detach();
}

BackgroundFileWriter::~BackgroundFileWriter() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->stopping = true;
  shared_->changed.notify_all();
}

namespace {
void enqueue(std::deque<Op>& queue, Kind kind, const std::string& path, const std::string& data) {
  if (kind != Kind::kAppend) {
    for (Op& op : queue) {
      if (op.kind == kind && op.path == path) {
        op.data = data;  // only the newest content matters
        return;
      }
    }
  }
  queue.push_back({kind, path, data, Clock::now()});
}
}  // namespace

void BackgroundFileWriter::append_bytes(const std::string& path, const std::string& data) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  if (shared_->queue.size() >= kMaxQueued) {
    ++shared_->dropped;
    return;
  }
  enqueue(shared_->queue, Kind::kAppend, path, data);
  shared_->changed.notify_all();
}

void BackgroundFileWriter::append_line(const std::string& path, const std::string& line) {
  append_bytes(path, line + '\n');
}

void BackgroundFileWriter::replace_file(const std::string& path, const std::string& data) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  enqueue(shared_->queue, Kind::kReplace, path, data);
  shared_->changed.notify_all();
}

bool BackgroundFileWriter::flush(double seconds) {
  std::unique_lock<std::mutex> lock(shared_->mutex);
  return shared_->changed.wait_for(lock, std::chrono::duration<double>(seconds),
                                   [&] { return shared_->queue.empty() && !shared_->busy; });
}

void BackgroundFileWriter::loop(std::shared_ptr<Shared> s) {
  std::unique_lock<std::mutex> lock(s->mutex);
  for (;;) {
    s->changed.wait_for(lock, std::chrono::seconds(1),
                        [&] { return !s->queue.empty() || s->stopping; });
    if (s->queue.empty()) {
      if (s->stopping) return;
      continue;
    }
    // The oldest write waiting tells how far behind the storage is.
    const double behind =
        std::chrono::duration<double>(Clock::now() - s->queue.front().queued).count();
    if (behind > kStalledSeconds && !s->warned_stall) {
      s->warned_stall = true;
      spdlog::warn(
          "the run directory's storage is {:.0f} s behind ({} writes waiting, {}); training "
          "goes on, and the metrics follow once it catches up",
          behind, s->queue.size(), s->queue.front().path);
    }
    Op op = std::move(s->queue.front());
    s->queue.pop_front();
    if (op.kind == Kind::kAppend) {
      // Everything queued for the same file goes in one write and one fsync: when the storage
      // is slow, an fsync is paid once per batch instead of once per record, and the queue
      // (what a SIGKILL loses) stays short.
      for (auto it = s->queue.begin(); it != s->queue.end();) {
        if (it->kind == Kind::kAppend && it->path == op.path) {
          op.data += it->data;
          it = s->queue.erase(it);
        } else {
          ++it;
        }
      }
    }
    s->busy = true;
    lock.unlock();
    std::string error;
    try {
      switch (op.kind) {
        case Kind::kAppend:
          fs::append_bytes(op.path, op.data);
          break;
        case Kind::kReplace:
          fs::replace_file(op.path, op.data);
          break;
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    lock.lock();
    s->busy = false;
    if (!error.empty() && s->failed.insert(op.path).second)
      spdlog::warn("could not write {}: {}; training goes on", op.path, error);
    if (error.empty()) s->failed.erase(op.path);
    if (s->queue.empty() && s->warned_stall) {
      s->warned_stall = false;
      spdlog::info(
          "the run directory's storage caught up{}",
          s->dropped ? " (" + std::to_string(s->dropped) + " metrics records dropped)" : "");
      s->dropped = 0;
    }
    s->changed.notify_all();
  }
}

double BackgroundFileWriter::seconds_behind() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  if (shared_->queue.empty()) return 0;
  return std::chrono::duration<double>(Clock::now() - shared_->queue.front().queued).count();
}

}  // namespace gpurun
