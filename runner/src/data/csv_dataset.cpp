// The `csv` dataset: feature columns and one label column of a CSV file (RFC 4180).
//
// Features are float32 numbers, standardised per column with the training split's mean and
// standard deviation. Labels are class indices when every label is an integer >= 0
// (classes = the largest + 1); otherwise each distinct label text is a class, numbered in
// sorted (byte) order over both splits, e.g. setosa=0, versicolor=1, virginica=2, and the
// names are kept as DatasetSplits::class_names.
//
// The reader is a small strict one rather than Debian's libcsv-dev (libcsv 3.0.3: a C callback
// API that reports no line numbers, and one more package for every user and Docker image) or
// libfccp-dev (fast-cpp-csv-parser: the column count is a template argument, fixed at compile
// time): a malformed row must be reported with its file:line and what is wrong, and a numeric
// table needs nothing more than RFC 4180's quoting, which this reader implements completely.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/where.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "data/builtin_datasets.h"
#include "gpurun/errors.h"
#include "gpurun/registry.h"

namespace gpurun {
namespace {

/// data.label as a 0-based column index ("3"; "-1" counts from the end), or nullopt when it
/// is a column name.
std::optional<int64_t> parse_column_index(const std::string& label) {
  int64_t index = 0;
  const char* end = label.data() + label.size();
  const auto [ptr, ec] = std::from_chars(label.data(), end, index);
  if (label.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return index;
}

/// data.delimiter as the character it stands for: itself, or a tab for "\\t" and "tab".
char delimiter_char(const std::string& delimiter) {
  if (delimiter == "\\t" || delimiter == "tab") return '\t';
  return delimiter.empty() ? ',' : delimiter[0];
}

struct Row {
  size_t line = 0;  ///< 1-based line where the record starts
  std::vector<std::string> fields;
};

/// The records of `text` (RFC 4180): fields separated by `delimiter`, records by LF or CRLF;
/// a field in double quotes may hold the delimiter, line breaks, and "" for one quote. Blank
/// lines are skipped. Throws ConfigError "source:LINE: ..." for a quote inside an unquoted
/// field, text after a closing quote, or a quote never closed.
std::vector<Row> parse_records(const std::string& text, char delimiter, const std::string& source) {
  const auto fail = [&](size_t line, const std::string& what) {
    throw ConfigError(source + ":" + std::to_string(line) + ": " + what);
  };
  std::vector<Row> rows;
  const size_t n = text.size();
  size_t i = 0, line = 1;
  while (i < n) {
    Row row;
    row.line = line;
    bool any_quoted = false;
    for (;;) {
      std::string field;
      if (i < n && text[i] == '"') {
        any_quoted = true;
        const size_t opened = line;
        for (++i;; ++i) {
          if (i >= n) fail(opened, "a quoted field is never closed");
          if (text[i] == '"') {
            if (i + 1 < n && text[i + 1] == '"') {
              field += '"';
              ++i;
              continue;
            }
            ++i;
            break;
          }
          if (text[i] == '\n') ++line;
          field += text[i];
        }
        if (i < n && text[i] == '\r' && i + 1 < n && text[i + 1] == '\n') ++i;
        if (i < n && text[i] != delimiter && text[i] != '\n')
          fail(line, "text after the closing quote of a field");
      } else {
        for (; i < n && text[i] != delimiter && text[i] != '\n'; ++i) {
          if (text[i] == '"')
            fail(line,
                 "a quote inside an unquoted field (quote the whole field, and double the quote)");
          field += text[i];
        }
        if (!field.empty() && field.back() == '\r' && (i >= n || text[i] == '\n')) field.pop_back();
      }
      row.fields.push_back(std::move(field));
      if (i < n && text[i] == delimiter) {
        ++i;
        continue;
      }
      if (i < n) ++i, ++line;  // the '\n'
      break;
    }
    if (row.fields.size() == 1 && row.fields[0].empty() && !any_quoted) continue;  // blank line
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\\\"") : std::string(1, ch);
  return out + "\"";
}

/// One file's rows as columns: features [rows x F] and the label texts.
struct Table {
  std::string source;
  std::vector<std::string> names;  ///< column names (header) or "column N"
  size_t label = 0;                ///< index of the label column
  std::vector<float> features;     ///< row-major
  std::vector<std::string> labels;
  std::vector<size_t> lines;  ///< line of each row, for messages
  int64_t rows() const { return static_cast<int64_t>(labels.size()); }
};

Table read_table(const std::string& path, const char* key, const DataConfig& c) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError(std::string(key) + ": cannot read " + path + ": " + std::strerror(errno));
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::vector<Row> rows = parse_records(buffer.str(), delimiter_char(c.delimiter), path);
  if (rows.empty()) throw ConfigError(std::string(key) + ": " + path + " holds no rows");

  Table t;
  t.source = path;
  const size_t columns = rows[0].fields.size();
  const size_t width_line = rows[0].line;
  if (columns < 2)
    throw ConfigError(path + ":" + std::to_string(width_line) + ": one column; the csv dataset " +
                      "needs feature columns and a label column (data.delimiter is " +
                      quoted(c.delimiter) + ")");
  if (c.header) {
    for (const auto& name : rows[0].fields) t.names.push_back(trimmed(name));
  } else {
    for (size_t k = 0; k < columns; ++k) t.names.push_back("column " + std::to_string(k));
  }
  if (const auto index = parse_column_index(c.label)) {
    const int64_t k = *index < 0 ? *index + static_cast<int64_t>(columns) : *index;
    if (k < 0 || k >= static_cast<int64_t>(columns))
      throw ConfigError("data.label: column " + c.label + " is outside the " +
                        std::to_string(columns) + " columns of " + path);
    t.label = static_cast<size_t>(k);
  } else {
    const auto it = std::find(t.names.begin(), t.names.end(), c.label);
    if (it == t.names.end()) {
      std::string all;
      for (const auto& name : t.names) all += (all.empty() ? "" : ", ") + name;
      throw ConfigError("data.label: no column " + quoted(c.label) + " in the header of " + path +
                        ":" + std::to_string(width_line) + " (columns: " + all + ")");
    }
    t.label = static_cast<size_t>(it - t.names.begin());
  }
  for (size_t r = c.header ? 1 : 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    const std::string where = path + ":" + std::to_string(row.line) + ": ";
    if (row.fields.size() != columns)
      throw ConfigError(where + std::to_string(row.fields.size()) + " fields, expected " +
                        std::to_string(columns) + " (as in line " + std::to_string(width_line) +
                        ")");
    for (size_t k = 0; k < columns; ++k) {
      std::string field = trimmed(row.fields[k]);
      if (k == t.label) {
        if (field.empty()) throw ConfigError(where + "the label (" + t.names[k] + ") is empty");
        t.labels.push_back(std::move(field));
        continue;
      }
      float value = 0;
      const char* begin = field.data() + (field.size() > 1 && field[0] == '+' ? 1 : 0);
      const char* end = field.data() + field.size();
      const auto [ptr, ec] = std::from_chars(begin, end, value);
      if (field.empty() || ec != std::errc() || ptr != end || !std::isfinite(value))
        throw ConfigError(where + "column " + std::to_string(k) + " (" + t.names[k] +
                          "): " + quoted(row.fields[k]) + " is not a finite number");
      t.features.push_back(value);
    }
    t.lines.push_back(row.line);
  }
  if (t.labels.empty())
    throw ConfigError(std::string(key) + ": " + path + " holds a header but no rows");
  return t;
}

/// True when `s` is an integer >= 0 (a class index).
bool is_index(const std::string& s) {
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && ptr == s.data() + s.size() && v >= 0;
}

DatasetSplits load_csv(const DataConfig& c) {
  Table train = read_table(c.path, "data.path", c);
  const int64_t width = static_cast<int64_t>(train.names.size()) - 1;
  std::optional<Table> eval;
  if (!c.eval_path.empty()) {
    eval = read_table(c.eval_path, "data.eval_path", c);
    if (static_cast<int64_t>(eval->names.size()) - 1 != width)
      throw ConfigError("data.eval_path: " + c.eval_path + " has " +
                        std::to_string(eval->names.size()) + " columns, " + c.path + " has " +
                        std::to_string(width + 1));
  }

  // Labels to class indices, over both files.
  std::vector<std::string> all(train.labels);
  if (eval) all.insert(all.end(), eval->labels.begin(), eval->labels.end());
  const bool indices = std::all_of(all.begin(), all.end(), is_index);
  std::vector<std::string> names;
  std::map<std::string, int64_t> class_of;
  if (!indices) {
    names = all;
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    for (size_t k = 0; k < names.size(); ++k) class_of[names[k]] = static_cast<int64_t>(k);
  }
  const auto to_tensors = [&](const Table& t) {
    std::vector<int64_t> y;
    for (const auto& label : t.labels) y.push_back(indices ? std::stoll(label) : class_of[label]);
    at::Tensor x =
        at::from_blob(const_cast<float*>(t.features.data()), {t.rows(), width}, at::kFloat).clone();
    return std::make_pair(x, at::from_blob(y.data(), {t.rows()}, at::kLong).clone());
  };
  auto [train_x, train_y] = to_tensors(train);
  at::Tensor eval_x, eval_y;
  if (eval) {
    std::tie(eval_x, eval_y) = to_tensors(*eval);
  } else {
    // A shuffle first (seeded with data.seed alone), since CSV files are often sorted by label.
    const int64_t n = train.rows();
    const auto held = static_cast<int64_t>(std::llround(c.eval_fraction * n));
    if (held < 1 || held >= n)
      throw ConfigError(
          "data.eval_fraction " + std::to_string(c.eval_fraction) + " of the " + std::to_string(n) +
          " rows of " + c.path +
          " leaves no evaluation or no training rows; change it or give data.eval_path");
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(c.seed));
    at::Tensor order = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
    at::Tensor eval_rows = order.narrow(0, 0, held), train_rows = order.narrow(0, held, n - held);
    eval_x = at::index_select(train_x, 0, eval_rows);
    eval_y = at::index_select(train_y, 0, eval_rows);
    train_x = at::index_select(train_x, 0, train_rows);
    train_y = at::index_select(train_y, 0, train_rows);
  }
  if (c.train_samples > train_x.size(0) || c.eval_samples > eval_x.size(0))
    throw ConfigError("data.train_samples/eval_samples: asked for " +
                      std::to_string(c.train_samples) + "/" + std::to_string(c.eval_samples) +
                      " samples; " + c.path + " gives " + std::to_string(train_x.size(0)) + "/" +
                      std::to_string(eval_x.size(0)));
  if (c.train_samples > 0) {
    train_x = train_x.narrow(0, 0, c.train_samples);
    train_y = train_y.narrow(0, 0, c.train_samples);
  }
  if (c.eval_samples > 0) {
    eval_x = eval_x.narrow(0, 0, c.eval_samples);
    eval_y = eval_y.narrow(0, 0, c.eval_samples);
  }

  // Standardised with the training split's statistics; a constant column is only centred.
  at::Tensor mean = train_x.mean({0}, /*keepdim=*/true);
  at::Tensor scale = train_x.size(0) > 1 ? train_x.std({0}, /*unbiased=*/true, /*keepdim=*/true)
                                         : at::ones_like(mean);
  scale = at::where(scale.gt(0), scale, at::ones_like(scale));
  DatasetSplits splits;
  splits.train = std::make_shared<TensorDataset>(train_x.sub(mean).div(scale), train_y);
  splits.eval = std::make_shared<TensorDataset>(eval_x.sub(mean).div(scale), eval_y);
  splits.input_shape = {width};
  splits.num_classes =
      indices ? std::max(train_y.max().item<int64_t>(), eval_y.max().item<int64_t>()) + 1
              : static_cast<int64_t>(names.size());
  splits.class_names = names;
  return splits;
}

}  // namespace

void register_csv_dataset(Registry& registry) { registry.add_dataset("csv", load_csv); }

}  // namespace gpurun
