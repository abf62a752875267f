// The device a rank trains on, chosen before anything touches it, and the settings that make
// its results reproducible.
#pragma once

#include <string>

#include <c10/core/Device.h>

namespace gpurun {

/// "auto" (CUDA when available, else the CPU), "cpu" or "cuda". A CUDA device gets index
/// `local_rank` (one GPU per rank, as torchrun's LOCAL_RANK), and becomes the current CUDA
/// device at once, so that every tensor, cuBLAS handle and NCCL communicator made afterwards
/// lives on it. CUBLAS_WORKSPACE_CONFIG is set to ":4096:8" unless the environment sets it:
/// cuBLAS reads it when it makes its first handle, and deterministic cuBLAS needs it (PyTorch's
/// "Reproducibility" notes).
/// Throws ConfigError for another name, for "cuda" without a CUDA device, and for a
/// `local_rank` beyond the devices this process sees.
c10::Device select_device(const std::string& name, int local_rank = 0);

/// On a CUDA device, turns deterministic algorithms on or off for the whole process: cuDNN
/// deterministic and not benchmarking, and at::Context's deterministic algorithms (warning,
/// not failing, for an operation that has none). On the CPU, where gpurun's operations are
/// already deterministic for a fixed thread count, nothing changes. Logs a warning when
/// `deterministic` is off on CUDA: a resume is then not bit-identical.
void set_determinism(const c10::Device& device, bool deterministic);

}  // namespace gpurun
