// A receiver of a byte stream: a file being written, a checksum, a buffer.
#pragma once

#include <cstddef>
#include <functional>

namespace gpurun {

/// Receives bytes in order, in pieces of any size (`bytes` may be 0). The pointer is valid only
/// during the call. What it throws (an IoError of the file written) ends the stream.
using ByteSink = std::function<void(const char* data, size_t bytes)>;

/// Writes the bytes of one file, in order, into `out`. Each call must produce the same bytes: a
/// write that failed for a moment is done again from the start.
using ByteSource = std::function<void(const ByteSink& out)>;

}  // namespace gpurun
