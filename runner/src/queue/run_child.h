// What one run's child of `gpurun queue` gets (queue_runner.h): its command line, its CUDA
// device or its share of the CPUs, and what its log says when it fails. No Torch headers.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace gpurun {

/// The CUDA devices a queue spreads its runs over, as CUDA_VISIBLE_DEVICES values: from
/// `env`'s CUDA_VISIBLE_DEVICES when set (its entries up to the first empty or "-1", as the
/// CUDA runtime reads it), else one per `dev_dir`/nvidiaN, in order of N. Empty on CPU.
std::vector<std::string> cuda_devices(const std::map<std::string, std::string>& env,
                                      const std::string& dev_dir = "/dev");

/// The command line of one run: BINARY run CONFIG --ckpt DIR/runs/NAME --resume, then --set
/// for each of `sets`.
std::vector<std::string> run_argv(const std::string& binary, const std::string& dir,
                                  const std::string& name, const std::string& config,
                                  const std::vector<std::string>& sets);

/// The CPUs this process may run on (its affinity mask: a container's or Slurm's cpuset), else
/// hardware_concurrency(); at least 1.
unsigned usable_cpus();

/// Whether `sets` (KEY=VALUE) give `key`.
bool has_set(const std::vector<std::string>& sets, const std::string& key);

/// Whether the config file `config` sets train.threads itself (then the queue leaves it
/// alone); false for a file that does not parse (the run's own gpurun reports it). Throws
/// nothing.
bool config_sets_threads(const std::string& config);

/// The last "gpurun error ..." line of the log `path` (else its last line), colour codes
/// removed, at most 500 characters; "" when it cannot be read. Throws nothing.
std::string last_error_line(const std::string& path);

/// How a child ended, for messages: "exited 2 (usage or config error, not retried)", "was
/// killed by SIGKILL", ...
std::string describe_exit(int exit_code, int signal);

}  // namespace gpurun
