#include "cli/report_command.h"

#include <climits>
#include <cstdlib>

#include "view/report_page.h"

namespace gpurun {

int report_command(const std::string& dir, const std::string& out_path, std::ostream& out) {
  const std::string path = write_report(dir, out_path);
  char absolute[PATH_MAX];
  const bool resolved = realpath(path.c_str(), absolute) != nullptr;
  out << "wrote " << path << "\n";
  if (resolved) out << "open file://" << absolute << " in a browser (it needs no network)\n";
  return 0;
}

}  // namespace gpurun
