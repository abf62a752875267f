// RUN_DIR/tensorboard/: the run's scalars as TensorBoard event files, so that
// `tensorboard --logdir RUN_DIR` plots them (docs/architecture.md, "TensorBoard files").
//
// Each process that trains writes a file of its own, events.out.tfevents.<seconds>.<host>.
// <pid>.gpurun, whose name sorts after every file already in the directory (TensorBoard reads
// a directory's files in name order). A file is a sequence of TFRecords (tensorflow/core/lib/
// io/record_writer.cc): the payload's length as uint64 little-endian, the masked CRC-32C of
// those 8 bytes, the payload, its masked CRC-32C. Each payload is a protobuf Event
// (report/tensorboard_event.proto): first file_version "brain.Event:2", then a SessionLog
// START at the first step this process trains, then one Summary of scalars per metrics event.
//
// The START is what makes a resume exact in TensorBoard: its readers drop every value already
// read at that step or later, i.e. what a killed process logged after the checkpoint the run
// resumed from, so that each step's value appears once, the one of the process that went on.
// A plan's values are recorded at the first step they apply to (the plan event's global_step
// plus one), for the same reason: a process killed before its first step leaves nothing that
// the next one would duplicate.
//
// Records go to the run directory's background writer (report/file_writer.h) as their event
// happens; it appends and fsyncs them as soon as the storage takes them (a checkpoint's with
// the rest), and slow storage never stalls training. A SIGKILL loses what it had not written
// yet: with healthy storage the records of the last few milliseconds.
// A directory that cannot be made, or a file that cannot be written, is warned about once and
// the run goes on without TensorBoard files.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gpurun {

class BackgroundFileWriter;

/// The scalars (tag, value) a metrics.jsonl event carries, and the step they belong to.
struct ScalarRecord {
  int64_t step = 0;
  double wall_time = 0;  ///< Unix seconds: the event's "time"
  std::vector<std::pair<std::string, double>> values;
};

/// The TensorBoard scalars of one metrics event ({"event": name, "time": ..., fields}), or none
/// (values empty) for events that carry no scalar. `capacity_bytes` is the last plan's, added
/// to each epoch's measured peak so that the two are plotted together. Tags: train/loss,
/// train/lr, train/samples_per_second, train/loss_scale (fp16), train/epoch_loss, eval/loss,
/// eval/accuracy, memory/peak_bytes, memory/capacity_bytes, memory/measured_peak_bytes,
/// memory/estimated_peak_bytes, plan/micro_batch, plan/accumulation_steps,
/// checkpoint/stall_seconds, checkpoint/write_seconds, checkpoint/bytes,
/// checkpoint/copy_seconds. Throws nothing; non-numeric fields are left out, except a null
/// train loss (JSON's NaN or infinity: the run diverged), which is written as NaN.
ScalarRecord scalars_of_event(const nlohmann::json& line, double capacity_bytes);

/// One TFRecord holding `payload` (length, masked CRC-32C of the length, payload, masked
/// CRC-32C of the payload).
std::string tfrecord(const std::string& payload);

class TensorBoardWriter {
 public:
  /// Nothing is created until the first event with scalars; `files` must outlive the writer.
  TensorBoardWriter(std::string dir, BackgroundFileWriter& files);

  /// Records the scalars of a metrics event (scalars_of_event). The first `plan` event (training
  /// starts) opens the file and writes the SessionLog START at its global_step + 1. Throws
  /// nothing: a failure is warned about once and turns the writer off.
  void record(const nlohmann::json& line);

  /// The file this process writes; "" before the first record or when turned off.
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  BackgroundFileWriter& files_;
  std::string path_;
  bool started_ = false, off_ = false;
  double capacity_bytes_ = 0;

  bool open(double wall_time);
};

}  // namespace gpurun
