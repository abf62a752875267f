// The rooms of runner/src/ and what may include what, as docs/architecture.md's rooms table
// writes them down (Chromium's DEPS and checkdeps, in one table): every file of runner/src/ is
// listed in one row, and a file includes only files of its own row and of the rows above it.
// Reading the table from the document keeps the document true: a file moved or added without
// its row fails here, and so does an include that climbs.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

namespace stdfs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Each file's row in the table ("checkpoint/store" -> 7), keyed by room and base name. The
/// rows are the lines of the table under "| room | files | concern |" whose first cell names a
/// room in backticks; the file names are the backticked words of the second cell without an
/// extension (`report.js` is not a C++ file).
std::map<std::string, int> rows_of_the_table(std::vector<std::string>& rooms) {
  const std::string doc = slurp(std::string(GPURUN_SOURCE_DIR) + "/docs/architecture.md");
  std::istringstream lines(doc.substr(doc.find("| room | files | concern |")));
  std::map<std::string, int> row_of;
  const std::regex word("`([a-z_0-9*]+)`");
  int row = -1;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| `", 0) != 0) {
      if (row >= 0 && line.rfind("|---", 0) != 0) break;  // the end of the table
      continue;
    }
    ++row;
    const size_t first = line.find('|', 1), second = line.find('|', first + 1);
    // "| `checkpoint/format/` |" -> "checkpoint/format"; "| `checkpoint/` (policy) |" ->
    // "checkpoint".
    const std::string room = line.substr(3, line.find("/`", 3) - 3);
    rooms.push_back(room);
    const std::string files = line.substr(first + 1, second - first - 1);
    for (std::sregex_iterator it(files.begin(), files.end(), word), end; it != end; ++it)
      row_of[room + "/" + (*it)[1].str()] = row;
  }
  return row_of;
}

TEST(Layering, EveryFileOfRunnerSrcIsInTheRoomsTableAndIncludesNoRowBelowIts) {
  std::vector<std::string> rooms;
  const std::map<std::string, int> row_of = rows_of_the_table(rooms);
  ASSERT_GT(rooms.size(), 10u) << "no rooms table in docs/architecture.md";
  const auto row = [&](const std::string& room, const std::string& name) {
    if (const auto it = row_of.find(room + "/" + name); it != row_of.end()) return it->second;
    if (const auto it = row_of.find(room + "/*_command");
        it != row_of.end() && name.size() > 8 && name.compare(name.size() - 8, 8, "_command") == 0)
      return it->second;
    return -1;
  };
  const std::regex include("#include \"([a-z_/]+)/([a-z_0-9.]+)\\.h\"");
  int checked = 0;
  for (const char* top : {"runner/src", "runner/cli"}) {
    for (const auto& entry :
         stdfs::recursive_directory_iterator(std::string(GPURUN_SOURCE_DIR) + "/" + top)) {
      const stdfs::path path = entry.path();
      if (path.extension() != ".h" && path.extension() != ".cpp") continue;
      // A room is the folder under runner/src/, nested ones included ("checkpoint/format").
      const std::string room =
          std::string(top) == "runner/cli"
              ? "cli"
              : stdfs::relative(path.parent_path(), std::string(GPURUN_SOURCE_DIR) + "/" + top)
                    .string();
      const std::string name = path.stem().string();
      const int mine = row(room, name);
      EXPECT_GE(mine, 0) << room << "/" << path.filename().string()
                         << " is in no row of docs/architecture.md's rooms table";
      if (mine < 0) continue;
      const std::string text = slurp(path.string());
      for (std::sregex_iterator it(text.begin(), text.end(), include), end; it != end; ++it) {
        const std::string to_room = (*it)[1].str(), to = (*it)[2].str();
        if (to_room == "gpurun") continue;  // the SDK, at the bottom
        // Where checkpoints live is the policy's business: memory/ and train/ see its types.
        if (room == "memory" || room == "train") {
          EXPECT_NE(to_room, "checkpoint/storage")
              << room << "/" << path.filename().string() << " includes " << to_room << "/" << to
              << ".h: memory/ and train/ include checkpoint/format/ and checkpoint/, not storage";
        }
        const int theirs = row(to_room, to);
        // A header generated at build time (report/tensorboard_event.pb.h,
        // forecast/bundled_cards.h) belongs to the room that generates it.
        if (theirs < 0 && to_room == room) continue;
        EXPECT_GE(theirs, 0) << path.string() << " includes " << to_room << "/" << to
                             << ".h, which the rooms table does not list";
        EXPECT_LE(theirs, mine) << room << "/" << path.filename().string() << " (row "
                                << rooms[mine] << ") includes " << to_room << "/" << to
                                << ".h from a row below (" << rooms[theirs] << ")";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}

}  // namespace
