#include "view/report_page.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "gpurun/errors.h"

#include "util/fs.h"
#include "util/text.h"
#include "view/page_assets.h"
#include "view/report_data.h"
#include "view/run_history.h"

namespace gpurun {
namespace {

template <size_t N>
std::string joined(const std::string_view (&parts)[N]) {
  std::string out;
  for (std::string_view p : parts) out += p;
  return out;
}

/// Script text made safe inside a <script> element: "</" could end the element early, and
/// "<!--" would open an HTML comment. "<\/" and "<\!--" mean the same in JavaScript's strings
/// and regular expressions.
std::string script_safe(std::string text) {
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"</", "<\\/"},
                                 std::pair<std::string, std::string>{"<!--", "<\\!--"}}) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  }
  return text;
}

/// JSON text whose '<', '>' and '&' are written as \u escapes: valid JSON still (they occur
/// only in strings), and nothing in it can end or change the script element that holds it.
std::string json_for_script(const nlohmann::json& data) {
  const std::string text = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '<')
      out += "\\u003c";
    else if (c == '>')
      out += "\\u003e";
    else if (c == '&')
      out += "\\u0026";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string report_html(const nlohmann::json& data) {
  std::string page =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>gpurun report</title>\n<style>\n";
  page += joined(kReportCss);
  page += "</style>\n</head>\n<body>\n<div id=\"app\"></div>\n";
  // The data as JSON in a script element that is not run; the page's script reads it with
  // JSON.parse.
  page += "<script type=\"application/json\" id=\"gpurun-data\">";
  page += json_for_script(data);
  page += "</script>\n<script>\n";
  page += script_safe(joined(kChartJs));
  page += "\n</script>\n<script>\n";
  page += script_safe(joined(kReportJs));
  page += "</script>\n</body>\n</html>\n";
  return page;
}

namespace {

/// The first `bytes` bytes of the file `path` (fewer when it is shorter). Throws IoError.
std::string head_of(const std::string& path, size_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("open", path, errno);
  std::string head(bytes, '\0');
  size_t used = 0;
  while (used < bytes) {
    const ssize_t n = ::read(fd, head.data() + used, bytes - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw IoError("read", path, err);
    }
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  ::close(fd);
  head.resize(used);
  return head;
}

/// Refuses a page path that would replace something that is not a page: a run's own files
/// (metrics.jsonl, LATEST) are one mistyped --out away.
void check_out_path(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      throw ConfigError("--out " + path + " is a directory: give a file name, e.g. " + path +
                        "/report.html");
    // The first bytes decide: a page starts with its doctype. (The whole file was read, 20 s
    // and 3.5 GB for a 3 GB file.) A FIFO or a device is no page, and is not opened.
    if (!S_ISREG(st.st_mode) || !starts_with(head_of(path, 64), "<!DOCTYPE html>"))
      throw ConfigError("--out " + path +
                        " exists and is not an HTML page: gpurun report replaces only "
                        "pages; give a new file name");
    return;
  }
  const std::string parent = std::filesystem::path(path).parent_path().string();
  if (!parent.empty() && !fs::exists(parent))
    throw ConfigError("--out " + path + ": no directory " + parent);
}

}  // namespace

std::string write_report(const std::string& dir, const std::string& out) {
  struct stat st {};
  if (stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    throw ConfigError(dir +
                      " is not a directory (give a run directory: the --ckpt or --run-dir "
                      "of `gpurun run`, or a `gpurun queue` --dir)");
  // A --out given is checked first: its refusal must not wait for a long run's history to be
  // read. The default place is checked once the directory proved to be a run's.
  const std::string path = out.empty() ? dir + "/report.html" : out;
  if (!out.empty()) check_out_path(path);
  const nlohmann::json data = fs::exists(dir + "/queue.json")
                                  ? queue_report_data(dir)
                                  : run_report_data(read_run_history(dir));
  if (out.empty()) check_out_path(path);
  try {
    fs::replace_file(path, report_html(data));
  } catch (const IoError& e) {
    if (!out.empty()) throw;
    throw Error(std::string(e.what()) + "; give --out FILE.html to write the page elsewhere");
  }
  return path;
}

}  // namespace gpurun
