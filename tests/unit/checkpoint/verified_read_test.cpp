// A checkpoint file read in place by a resume (checkpoint/verified_read.h): whatever order the
// reads come in, verify() has the xxh3 of the whole file, and a file that is not what its
// manifest says is refused.
#include "checkpoint/format/verified_read.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/temp_dir.h"
#include "gpurun/errors.h"
#include "util/fs.h"
#include "util/hash.h"

namespace gpurun {
namespace {

std::string random_bytes(size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::copy_n(reinterpret_cast<const char*>(&v), 8, &out[i]);
  }
  return out;
}

struct Range {
  uint64_t pos;
  size_t n;
};

/// Reads `ranges` in order and checks every read's bytes against `data`.
void read_all(const VerifyingFileReader& file, const std::string& data,
              const std::vector<Range>& ranges) {
  for (const Range& r : ranges) {
    std::string buf(r.n, '\0');
    const size_t got = file.read(r.pos, buf.data(), r.n);
    const size_t want = std::min<size_t>(r.n, data.size() - std::min<size_t>(r.pos, data.size()));
    ASSERT_EQ(got, want) << "at " << r.pos;
    ASSERT_EQ(buf.substr(0, got), data.substr(r.pos, got)) << "at " << r.pos;
  }
}

class VerifiedRead : public ::testing::Test {
 protected:
  void write(size_t n) {
    data_ = random_bytes(n, 7);
    fs::write_file(path_, data_);
    xxh3_ = xxh3_hex(data_);
  }
  test::TempDir dir_;
  const std::string path_ = dir_ / "optim.pt";
  std::string data_, xxh3_;
};

// The pattern of LibTorch's zip reader: the directory at the end first, then a local header and
// the data of each record in file order, the pickle (near the end) in between, a few bytes read
// twice, and the zip's padding never asked for.
TEST_F(VerifiedRead, ReadsInAnyOrderHashTheWholeFile) {
  write(3 << 20);
  const size_t size = data_.size();
  std::vector<Range> ranges{{size - 22, 22}, {size - 4096, 4096}, {size - 9000, 3000}};
  for (uint64_t at = 0; at + 300000 < size - 9000; at += 300000) {
    ranges.push_back({at, 30});                 // local header
    ranges.push_back({at + 64, 300000 - 100});  // data (the rest is padding, never read)
  }
  ranges.push_back({size - 2, 10});  // across the end: a short read
  VerifyingFileReader file(path_, static_cast<int64_t>(size), xxh3_);
  EXPECT_EQ(file.size(), size);
  read_all(file, data_, ranges);
  EXPECT_NO_THROW(file.verify());
}

// Records in file order, each behind a local header whose name and padding no read asks for,
// in a file larger than what may be held aside: the skipped bytes are read as the next record
// arrives, so verify() reads nothing again and nothing is held aside.
TEST_F(VerifiedRead, RecordsInFileOrderAreHashedInOnePass) {
  write(VerifyingFileReader::kAsideLimitBytes + (8 << 20));
  const size_t record = 1 << 20;
  std::vector<Range> ranges;
  for (uint64_t at = 0; at < data_.size(); at += record) {
    ranges.push_back({at, 30});
    ranges.push_back({at + 64, record - 64});
  }
  VerifyingFileReader file(path_, static_cast<int64_t>(data_.size()), xxh3_);
  read_all(file, data_, ranges);
  EXPECT_NO_THROW(file.verify());
  EXPECT_EQ(file.reread_bytes(), 0);
}

// A changed byte in the padding no read asks for is still found.
TEST_F(VerifiedRead, AChangedByteInSkippedPaddingIsRefused) {
  write(1 << 20);
  const std::string verified = xxh3_;
  data_[40] ^= 1;  // between a 30-byte local header and its record's data at 64
  fs::write_file(path_, data_);
  VerifyingFileReader file(path_, static_cast<int64_t>(data_.size()), verified);
  read_all(file, data_, {{0, 30}, {64, data_.size() - 64}});
  EXPECT_EQ(file.reread_bytes(), 0);
  EXPECT_THROW(file.verify(), ResumeError);
}

// Backwards, 1 MiB at a time, across a file larger than what may be held aside: memory stays
// bounded and the checksum is still the whole file's.
TEST_F(VerifiedRead, BackwardsBeyondTheAsideLimitStillVerifies) {
  write(VerifyingFileReader::kAsideLimitBytes + (8 << 20));
  std::vector<Range> ranges;
  for (uint64_t at = data_.size(); at > 0;) {
    const size_t n = std::min<uint64_t>(at, 1 << 20);
    at -= n;
    ranges.push_back({at, n});
  }
  VerifyingFileReader file(path_, static_cast<int64_t>(data_.size()), xxh3_);
  read_all(file, data_, ranges);
  EXPECT_NO_THROW(file.verify());
}

TEST_F(VerifiedRead, NothingReadIsReadByVerify) {
  write(100000);
  VerifyingFileReader file(path_, static_cast<int64_t>(data_.size()), xxh3_);
  EXPECT_NO_THROW(file.verify());
}

// The file is not what its manifest says (one byte changed, the size kept): the load is
// refused, naming the file and both checksums.
TEST_F(VerifiedRead, AChangedByteIsRefusedNamingTheFile) {
  write(1 << 20);
  const std::string verified = xxh3_;
  data_[12345] ^= 1;
  fs::write_file(path_, data_);
  VerifyingFileReader file(path_, static_cast<int64_t>(data_.size()), verified);
  read_all(file, data_, {{0, data_.size()}});
  try {
    file.verify();
    ADD_FAILURE() << "no ResumeError";
  } catch (const ResumeError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path_), std::string::npos) << what;
    EXPECT_NE(what.find("does not match its manifest"), std::string::npos) << what;
    EXPECT_NE(what.find(verified), std::string::npos) << what;
  }
}

TEST_F(VerifiedRead, AnotherSizeOrNoFileIsRefusedAtOnce) {
  write(1000);
  EXPECT_THROW(VerifyingFileReader(path_, 999, xxh3_), ResumeError);
  EXPECT_THROW(VerifyingFileReader(dir_ / "missing.pt", 1000, xxh3_), IoError);
}

}  // namespace
}  // namespace gpurun
