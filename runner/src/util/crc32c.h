// CRC-32C (Castagnoli), the checksum of TensorBoard's TFRecord files. No Debian 12 package
// gives it to C++ (zlib's crc32 is the other polynomial), so it is the table form of a few
// lines. Source: RFC 3720, section 12.1 (polynomial 0x1EDC6F41, reflected 0x82F63B78).
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpurun {

/// CRC-32C of `size` bytes; crc32c("123456789") == 0xE3069283 (RFC 3720's check value).
uint32_t crc32c(const void* data, size_t size);

/// The CRC as TFRecord stores it, rotated right by 15 bits plus 0xa282ead8, so that a CRC of
/// bytes holding CRCs does not degenerate (tensorflow/core/lib/hash/crc32c.h, Mask).
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace gpurun
