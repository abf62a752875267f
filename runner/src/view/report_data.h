// What `gpurun report` draws, computed from a run or queue directory: the charts' points, the
// marks on their axes (resumes, restarts, signals, kills, out-of-memory fallbacks, failures)
// and the tables (plan, peak breakdown, resolved config, events). The page (report_page.h)
// only draws this object; every number in it is computed here.
//
// One run is several processes when it was stopped or killed and resumed: each process starts
// with a `plan` event at the global step it continues from (0 for a fresh start). What a killed
// process logged after that step was trained again by the next one, so the step-indexed curves
// keep only the points of the process that went on (as TensorBoard does with a SessionLog
// START, report/tensorboard_writer.h); the throughput, on the wall-time axis, keeps every
// process, since the time really passed.
//
// The object: {"kind": "run"|"queue", "title", "generated" (unix seconds), "notes": [text],
// "summary": [[label, text]], "charts": [{"id", "title", "x_label", "y_label", "x_axis":
// "step"|"epoch"|"minutes", "y_scale": "linear"|"logarithmic", "datasets": [{"label", "points":
// [[x, y]], "style": "line"|"points", "colour": index}], "marks": bool}], "marks": [{"kind",
// "label", "step", "minutes"}], "tables": [{"title", "columns": [text], "rows": [[text]],
// "collapsed": bool (optional)}]}.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "view/run_history.h"

namespace gpurun {

/// The report of one run. Throws nothing: what the history lacks is left out, with a note.
nlohmann::json run_report_data(const RunHistory& run);

/// The report of a `gpurun queue` directory: one table row and one line per run (a run that
/// has not logged yet has a row and no line). Throws ConfigError when DIR/queue.json is missing
/// or does not parse, IoError when it cannot be read.
nlohmann::json queue_report_data(const std::string& dir);

}  // namespace gpurun
