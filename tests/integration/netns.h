// Two nodes for a test: two network namespaces joined by a veth pair, node 0 at 10.233.0.1 and
// node 1 at 10.233.0.2, each process started in one of them with a host name of its own (a UTS
// namespace). The test cuts the link or drops packets with nftables while gpurun runs, as a
// switch port going down or a firewall would, and restores it.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "integration/harness.h"

namespace gpurun::test {

class TwoNodes {
 public:
  /// Creates the namespaces and the link (up). ok() is false, and why() says why, when this
  /// machine cannot (not root, no `ip`, network namespaces refused).
  TwoNodes();
  /// Deletes both namespaces (and with them the link); processes still in them keep running
  /// without a network, so a test ends its processes first.
  ~TwoNodes();
  TwoNodes(const TwoNodes&) = delete;
  TwoNodes& operator=(const TwoNodes&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  /// Whether `nft` is installed (drop_from() needs it).
  bool has_nft() const;

  /// "10.233.0.1" for node 0, "10.233.0.2" for node 1.
  static std::string address(int node);
  /// "node-<tag>-0" or "node-<tag>-1": the host name processes on `node` see.
  std::string host(int node) const;

  /// Starts `argv` (argv[0] absolute) on `node`: in its namespace, with its host name.
  pid_t start(int node, const std::vector<std::string>& argv, const std::string& log_prefix,
              const Env& env = {}) const;

  /// `ip link set ... down` / up on `node`'s end of the link. Throws on failure.
  void link_down(int node) const;
  void link_up(int node) const;
  /// An nftables rule on `node` silently dropping every packet from the other node; undrop()
  /// removes it. Throws on failure.
  void drop_from_peer(int node) const;
  void undrop(int node) const;

 private:
  std::string ns(int node) const;
  std::string veth(int node) const;
  void ip(const std::vector<std::string>& args) const;
  void nft(int node, const std::vector<std::string>& args) const;

  std::string tag_;
  bool ok_ = false;
  std::string why_;
};

}  // namespace gpurun::test
