// What `gpurun queue` prints at its end and writes to DIR/summary.csv and DIR/summary.json, and
// what `gpurun status DIR` shows of a queue directory. No Torch headers.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "queue/queue_state.h"

namespace gpurun {

/// One row of the summary: a run's record and the final metrics from its last `epoch` event
/// (NaN when it has none; an epoch counts from 1, 0 when none ended).
struct SummaryRow {
  RunRecord run;
  int64_t epochs = 0;
  double train_loss, eval_loss, eval_accuracy;
  /// Its checkpoints by manifests and sizes, checksums not read (check_run_checkpoints()):
  /// "ok", "" when it saved nothing, else the problem.
  std::string checkpoint;
};

/// A row per run of `state`, the metrics read from DIR/runs/NAME/metrics.jsonl, the checkpoints
/// from DIR/runs/NAME (their sizes).
std::vector<SummaryRow> summary_rows(const std::string& dir, const QueueState& state);

/// The rows as an aligned table: run, seed, state, exit, restarts, wall, epochs, eval_loss,
/// eval_accuracy, checkpoint ("ok", "DAMAGED" or "-"); then a line per damaged checkpoint with
/// its problem, and one saying that the checksums were not read.
void print_summary_table(const std::vector<SummaryRow>& rows, std::ostream& out);

/// The rows as JSON: {"runs": [...], "finished": N, "failed": N, "other": N,
/// "checkpoints_checked": "sizes"}; NaN as null; each run's "checkpoint" is "ok", its problem,
/// or null when it saved nothing.
nlohmann::json summary_json(const std::vector<SummaryRow>& rows);

/// Writes DIR/summary.csv (header run,seed,state,exit_code,restarts,wall_seconds,epochs,
/// train_loss,eval_loss,eval_accuracy; empty fields for unknown values) and DIR/summary.json,
/// each replaced atomically. Throws IoError.
void write_summary(const std::string& dir, const std::vector<SummaryRow>& rows);

/// `gpurun status DIR` of a queue directory (DIR/queue.json exists): the queue (live or not)
/// and every run's state, restarts, wall time and final metrics; a running run's epoch and
/// step from its status.json. With `json` one object: queue.json's fields with `live` and,
/// per run, `status` (its status.json) and `summary` (its row). Returns 0. Throws Error when
/// queue.json does not parse.
int queue_status(const std::string& dir, bool json, std::ostream& out);

}  // namespace gpurun
