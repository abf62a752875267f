#include "distributed/peer_probe.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

#include "gpurun/errors.h"
#include "util/units.h"

namespace gpurun {
namespace {

/// A numeric address and port as a socket address; false when `address` is not numeric.
bool numeric_address(const std::string& address, int port, sockaddr_storage& out,
                     socklen_t& length) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  std::memcpy(&out, found->ai_addr, found->ai_addrlen);
  length = found->ai_addrlen;
  freeaddrinfo(found);
  return true;
}

std::string text_of(const sockaddr_storage& s) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw =
      s.ss_family == AF_INET6
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&s)->sin6_addr)
          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&s)->sin_addr);
  return inet_ntop(s.ss_family, raw, text, sizeof text) ? text : "";
}

}  // namespace

std::string PeerAddress::to_text() const {
  return host + " " + address + " " + std::to_string(port);
}

PeerAddress PeerAddress::parse(int rank, const std::string& text) {
  PeerAddress p;
  p.rank = rank;
  std::istringstream in(text);
  if (!(in >> p.host >> p.address >> p.port) || p.port <= 0 || p.port > 65535)
    throw Error("rank " + std::to_string(rank) + " published an unreadable address: \"" + text +
                "\"");
  return p;
}

PeerBeacon::PeerBeacon(const std::string& address) {
  sockaddr_storage where{};
  socklen_t length = 0;
  if (!numeric_address(address, 0, where, length))
    throw Error("cannot listen on \"" + address + "\": not a numeric address");
  fd_ = socket(where.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  // The largest backlog: every peer of a large job may probe at once, and a full queue drops
  // connection attempts, which would read as a partition.
  if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&where), length) != 0 ||
      listen(fd_, SOMAXCONN) != 0 ||
      getsockname(fd_, reinterpret_cast<sockaddr*>(&where), &length) != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) close(fd_);
    throw Error("cannot listen on " + address + ": " + why);
  }
  port_ = ntohs(where.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&where)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&where)->sin_port);
  acceptor_ = std::thread([this] {
    while (!closing_) {
      const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0)
        close(c);
      else if (errno != EINTR && errno != ECONNABORTED)
        break;
    }
  });
}

PeerBeacon::~PeerBeacon() {
  closing_ = true;
  shutdown(fd_, SHUT_RDWR);  // wakes the blocked accept()
  acceptor_.join();
  close(fd_);
}

std::string source_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return "";
  std::string address;
  for (addrinfo* a = found; a && address.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0)
      address = text_of(local);
    close(fd);
  }
  freeaddrinfo(found);
  return address;
}

std::vector<bool> peers_answering(const std::vector<PeerAddress>& peers, double timeout_seconds) {
  std::vector<bool> answering(peers.size(), false);
  std::vector<pollfd> pending;
  std::vector<size_t> which;
  for (size_t i = 0; i < peers.size(); ++i) {
    sockaddr_storage where{};
    socklen_t length = 0;
    if (!numeric_address(peers[i].address, peers[i].port, where, length)) continue;
    const int fd = socket(where.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&where), length);
    if (rc == 0 || errno == ECONNREFUSED) {
      answering[i] = true;
      close(fd);
    } else if (errno == EINPROGRESS) {
      pending.push_back({fd, POLLOUT, 0});
      which.push_back(i);
    } else {
      close(fd);  // no route, network unreachable: no answer
    }
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  size_t open = pending.size();
  while (open > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0 || poll(pending.data(), pending.size(), static_cast<int>(left)) <= 0) break;
    for (size_t k = 0; k < pending.size(); ++k) {
      if (pending[k].fd < 0 || pending[k].revents == 0) continue;
      int error = 0;
      socklen_t size = sizeof error;
      getsockopt(pending[k].fd, SOL_SOCKET, SO_ERROR, &error, &size);
      // Connected, refused or reset: a node that answers at all is on the network.
      answering[which[k]] = error == 0 || error == ECONNREFUSED || error == ECONNRESET;
      close(pending[k].fd);
      pending[k].fd = -1;  // poll ignores negative descriptors
      --open;
    }
  }
  for (const pollfd& p : pending)
    if (p.fd >= 0) close(p.fd);
  return answering;
}

std::string partition_report(const std::vector<PeerAddress>& peers,
                             const std::vector<bool>& answering, double timeout_seconds) {
  std::string silent;
  for (size_t i = 0; i < peers.size(); ++i) {
    if (answering[i]) continue;
    silent += (silent.empty() ? "" : ", ") + std::string("rank ") + std::to_string(peers[i].rank) +
              " on " + peers[i].host + " (" + peers[i].address + ")";
  }
  const std::string within = format_seconds(timeout_seconds) + " s";
  if (silent.empty())
    return "every peer's node answers from here within " + within +
           ", so a peer process is stuck or has died: see its log";
  return "no answer from " + silent + " within " + within +
         ": the network between here and there is cut (a link down, a firewall dropping "
         "packets) or that node is down";
}

}  // namespace gpurun
