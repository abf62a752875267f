// Telling a network partition from a stuck peer when a collective fails. Gloo reports only
// "timed out waiting for recv" or "connection closed", never which peer or why. Every rank
// therefore listens on a small TCP beacon next to Gloo, publishes where (host name, address,
// port) through the rendezvous store, and on a failed collective tries to open a connection to
// every peer's beacon within a short deadline: a peer whose node answers is alive on the
// network (its process is stuck or gone), one that does not is cut off (a link down, packets
// dropped by a firewall, the node powered off). No Torch headers here.
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace gpurun {

/// Where a rank can be reached, as published at rendezvous.
struct PeerAddress {
  int rank = -1;
  std::string host;     ///< its host name (gethostname), for messages
  std::string address;  ///< the IP address its beacon and Gloo listen on
  int port = 0;         ///< its beacon's TCP port

  /// "HOST ADDRESS PORT", the form published in the store.
  std::string to_text() const;
  /// Parses to_text()'s form; throws Error on anything else.
  static PeerAddress parse(int rank, const std::string& text);
};

/// A TCP listener on `address` (an ephemeral port) that accepts connections and closes them at
/// once, on its own thread, until destroyed. Throws Error when the socket cannot be bound.
class PeerBeacon {
 public:
  explicit PeerBeacon(const std::string& address);
  ~PeerBeacon();
  PeerBeacon(const PeerBeacon&) = delete;
  PeerBeacon& operator=(const PeerBeacon&) = delete;

  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> closing_{false};
  std::thread acceptor_;
};

/// The address this host sends from to reach `host`: the kernel's route choice, read back from
/// a connected UDP socket (no packet is sent). "" when `host` does not resolve or has no route.
std::string source_address_towards(const std::string& host, int port);

/// For each of `peers`, whether a TCP connection to its beacon opens within `timeout_seconds`
/// (all probed at once, so the whole call takes at most about `timeout_seconds`). A refused
/// connection also counts as an answer: the node is on the network.
std::vector<bool> peers_answering(const std::vector<PeerAddress>& peers, double timeout_seconds);

/// The sentence a failed collective appends: which peers' nodes do not answer from here within
/// `timeout_seconds` and what that means, or that all answer (a stuck or dead peer process).
/// `answering[i]` belongs to `peers[i]`.
std::string partition_report(const std::vector<PeerAddress>& peers,
                             const std::vector<bool>& answering, double timeout_seconds);

}  // namespace gpurun
