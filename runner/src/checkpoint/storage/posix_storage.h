// A checkpoint root on a file system (a local disk, NFS, SMB, a FUSE mount): folders are
// directories, a save is written into DIR/.tmp-NAME-PID (same file system, so the final rename
// is atomic), every file and the folder fsync'd, then renamed to NAME and DIR fsync'd
// (util/fs.h: transient errors of network file systems retried, large files around the page
// cache on local disks). docs/architecture.md, "Checkpoint directory".
#pragma once

#include <string>

#include "checkpoint/storage/checkpoint_storage.h"

namespace gpurun {

class PosixStorage final : public CheckpointStorage {
 public:
  explicit PosixStorage(std::string dir);

  const std::string& root() const override { return dir_; }
  bool is_local() const override { return true; }
  void check_writable(const std::string& what) override;
  std::vector<std::string> folders() const override;
  std::vector<std::string> set_aside_names() const override;
  bool has_folder(const std::string& name) const override;
  StoredFile status(const std::string& name) const override;
  void read(const std::string& name, const ByteSink& out) const override;
  std::pair<int64_t, std::string> checksum(const std::string& name) const override;
  std::unique_ptr<FolderWrite> write_folder(const std::string& name) override;
  void replace(const std::string& name, const std::string& bytes) override;
  void remove_folder(const std::string& name) override;
  std::string set_aside(const std::string& name) override;
  void clean_temporaries() override;
  bool replace_if(const std::string& name, const std::string& bytes, const Expect& expect) override;
  bool remove_if(const std::string& name, const Expect& expect) override;

 private:
  std::string dir_;
};

}  // namespace gpurun
