// A checkpoint root in an S3 bucket (`--ckpt s3://BUCKET/PREFIX`: AWS, R2, B2, GCS's S3 API,
// Ceph's RGW, MinIO), with the guarantees of the directory protocol and no rename:
//
//   PREFIX/LATEST                        the hint, written after the checkpoint it names
//   PREFIX/lease.json                    the lease, taken with If-None-Match: *, renewed with
//   If-Match PREFIX/ckpt-e0003-s0000450/FILE      a checkpoint's files, each a (multipart) upload
//   PREFIX/ckpt-e0003-s0000450/manifest.json   written last: the commit
//   PREFIX/ckpt-e0003-s0000450.damaged   a marker that sets a checkpoint aside (no rename in S3)
//
// A folder exists for readers once its manifest does: S3 makes an object visible only when its
// upload completes, and the manifest is put after every other file's upload completed, so a
// kill at any moment leaves either a complete checkpoint or objects no reader takes (a prefix
// without a manifest, an incomplete multipart upload), which clean_temporaries() removes at the
// next start. docs/architecture.md, "Object storage".
#pragma once

#include <memory>
#include <string>

#include "checkpoint/storage/checkpoint_storage.h"
#include "s3/s3_settings.h"

namespace gpurun {

class S3Client;

class ObjectStorage final : public CheckpointStorage {
 public:
  /// The root "s3://BUCKET/PREFIX", reached with S3Settings::from_environment(). Makes no
  /// request. Throws ConfigError for a malformed URL or missing credentials.
  explicit ObjectStorage(const std::string& root);
  ~ObjectStorage() override;

  const std::string& root() const override { return root_; }
  bool is_local() const override { return false; }
  /// The endpoint answers, the credentials are accepted and the bucket exists (within 10 s,
  /// no retries); then a probe object is written, read and removed. Throws ConfigError.
  void check_writable(const std::string& what) override;
  void check_readable() override;
  std::string lease_problem() override;
  std::vector<std::string> folders() const override;
  std::vector<std::string> set_aside_names() const override;
  bool has_folder(const std::string& name) const override;
  StoredFile status(const std::string& name) const override;
  void read(const std::string& name, const ByteSink& out) const override;
  std::unique_ptr<FolderWrite> write_folder(const std::string& name) override;
  void replace(const std::string& name, const std::string& bytes) override;
  void remove_folder(const std::string& name) override;
  std::string set_aside(const std::string& name) override;
  void clean_temporaries() override;
  bool replace_if(const std::string& name, const std::string& bytes, const Expect& expect) override;
  bool remove_if(const std::string& name, const Expect& expect) override;

  S3Client& client() const { return *client_; }
  /// The key of `name` under the root's prefix.
  std::string key(const std::string& name) const { return url_.key(name); }

 private:
  std::string root_;
  S3Url url_;
  std::unique_ptr<S3Client> client_;
};

}  // namespace gpurun
