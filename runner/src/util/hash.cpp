#include "util/hash.h"

#include <xxhash.h>

#include <cstdio>
#include <new>

namespace gpurun {

Xxh3::Xxh3() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3::~Xxh3() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3::update(const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

uint64_t Xxh3::digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

std::string Xxh3::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(digest()));
  return buf;
}

std::string xxh3_hex(const std::string& data) {
  Xxh3 h;
  h.update(data.data(), data.size());
  return h.hex();
}

}  // namespace gpurun
