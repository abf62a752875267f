// `gpurun report RUN_DIR|QUEUE_DIR [--out FILE.html]`: the run's page (view/report_page.h).
#pragma once

#include <ostream>
#include <string>

namespace gpurun {

/// Writes the page and prints its path and a file:// address. Returns 0; throws what
/// write_report() throws (ConfigError: exit 2 for a directory that is no run).
int report_command(const std::string& dir, const std::string& out_path, std::ostream& out);

}  // namespace gpurun
