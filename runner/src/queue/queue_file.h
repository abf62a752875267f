// QUEUE.yaml of `gpurun queue` (docs/architecture.md, "Queue"): the list of runs it trains.
//
//   config: run.yaml            # the default config (relative paths: from the queue file's folder)
//   set: [train.epochs=3]       # overrides for every run, before each run's own
//   seeds: [1, 2, 3]            # one run of `config` per seed (train.seed=S), named seed-S
//   runs:                       # and/or runs of their own
//     - {config: other.yaml, set: [optim.lr=0.1], name: lr-0.1, seed: 4}
//   stop_command: sudo poweroff # run once the queue has nothing left to train (/bin/sh)
//
// The runs of a queue do not run their own cost.stop_command (the queue goes on after each);
// the queue's stop_command runs when it ends with every run finished or stopped at its budget.
//
// `config:` (with its `set:`) and neither `seeds:` nor `runs:` is a queue of one run, named
// after the config's file name. A negative seed is named with an m: seed -1 is `seed-m1` (and
// `NAME-seed-m1` in `runs:`). A seed listed twice in `seeds:` is an error naming both entries.
//
// Only the form is checked here (keys, types, KEY=VALUE, names, that config files exist); the
// config keys of `set` are checked by each run's own gpurun, so a wrong one fails that run
// only. No Torch headers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpurun {

/// One run of the queue.
struct QueueRun {
  std::string name;               ///< unique in the queue; a file name ([A-Za-z0-9._-])
  std::string config_path;        ///< absolute, lexically normal
  std::vector<std::string> sets;  ///< KEY=VALUE, in order: the queue's, the run's, train.seed
  std::optional<int64_t> seed;    ///< train.seed when the queue gives one
};

/// A parsed queue file.
struct QueueFile {
  std::string path;            ///< absolute and lexically normal from load_queue_file()
  std::vector<QueueRun> runs;  ///< in file order: the seeds' runs first, then `runs`
  std::string stop_command;    ///< "" when not given
};

/// Parses YAML `text`. `base_dir` resolves relative config paths; `source` names the file in
/// messages; `check_files`: a config that does not exist is an error. Throws ConfigError (exit
/// 2), naming the key and line, for YAML that does not parse, an unknown key (with "did you
/// mean"), a value of the wrong type, a set entry that is not KEY=VALUE, a bad or duplicate
/// name, a missing config, or a queue without runs.
QueueFile parse_queue_text(const std::string& text, const std::string& source,
                           const std::string& base_dir, bool check_files = true);

/// Reads and parses the file `path` (relative configs from its folder). Throws ConfigError as
/// parse_queue_text(), and when `path` cannot be read.
QueueFile load_queue_file(const std::string& path);

}  // namespace gpurun
