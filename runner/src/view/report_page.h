// `gpurun report DIR [--out FILE.html]`: one self-contained HTML page of a run or a queue
// directory. The page needs no network: Chart.js (Debian's libjs-chart.js, compiled into
// gpurun), the page's own script and style, and the data (report_data.h) are all inline.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace gpurun {

/// The page for `data` (run_report_data() or queue_report_data()).
std::string report_html(const nlohmann::json& data);

/// Writes the report of `dir` (a queue directory when it holds queue.json, else a run
/// directory) to `out`, DIR/report.html when "", replacing it atomically; returns the path.
/// Throws ConfigError for a directory that is neither (read_run_history's messages), IoError
/// when the page cannot be written.
std::string write_report(const std::string& dir, const std::string& out);

}  // namespace gpurun
