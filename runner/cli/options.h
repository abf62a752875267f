// The one table of gpurun's command-line options. The parser (command_line.cpp), --help and
// the launcher's rewrite of a worker's command line all read it, so a flag is declared once.
#pragma once

#include <string>
#include <vector>

namespace gpurun {

struct OptionSpec {
  enum class Type { kFlag, kString, kStrings, kInt, kDouble };
  const char* group;  ///< --help section
  const char* name;   ///< long name without "--"; "h,help" gives a short one too
  Type type;
  const char* value_name;     ///< "DIR", "N", ...; "" for a flag
  const char* default_value;  ///< "" for none
  const char* help;
  /// Taken by the launcher (supervisor, DDP); a worker's command line drops it.
  bool launcher_only = false;
};

/// Every option, in --help order.
const std::vector<OptionSpec>& option_table();

/// The --help sections in order.
const std::vector<std::string>& option_groups();

/// `argv` without the launcher-only options and their values (both "--opt V" and "--opt=V"),
/// argv[0] kept: what each worker the launcher starts runs.
std::vector<std::string> without_launcher_options(const std::vector<std::string>& argv);

}  // namespace gpurun
