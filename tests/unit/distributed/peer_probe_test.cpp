// peer_probe.h over real sockets on this machine: a live beacon answers, a closed port on a
// live host answers (refused), a port whose handshakes are silently dropped does not.
#include "distributed/peer_probe.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include <gtest/gtest.h>

#include "gpurun/errors.h"

namespace gpurun {
namespace {

/// A loopback port that drops connection attempts without a word, as a firewall's DROP rule
/// does: a listener with a backlog of 0 whose one queued connection is never accepted, so that
/// the kernel discards later SYNs. Closes its sockets when destroyed.
struct SilentPort {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  int filler = socket(AF_INET, SOCK_STREAM, 0);
  int port = 0;
  SilentPort() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof a;
    bind(listener, reinterpret_cast<sockaddr*>(&a), length);
    listen(listener, 0);
    getsockname(listener, reinterpret_cast<sockaddr*>(&a), &length);
    port = ntohs(a.sin_port);
    connect(filler, reinterpret_cast<sockaddr*>(&a), length);  // fills the accept queue
  }
  ~SilentPort() {
    close(filler);
    close(listener);
  }
};

TEST(PeerProbe, AddressRoundTripsAndAGarbledOneIsRefusedNamingTheRank) {
  const PeerAddress a{3, "node-b", "10.0.0.2", 41234};
  const PeerAddress b = PeerAddress::parse(3, a.to_text());
  EXPECT_EQ(b.host, "node-b");
  EXPECT_EQ(b.address, "10.0.0.2");
  EXPECT_EQ(b.port, 41234);
  try {
    PeerAddress::parse(5, "node-b 10.0.0.2");
    FAIL() << "no port accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(PeerAddress::parse(1, "h 10.0.0.2 70000"), Error);
}

TEST(PeerProbe, ABeaconAndAClosedPortAnswerAndAnUnreachableAddressDoesNotWithinTheDeadline) {
  PeerBeacon beacon("127.0.0.1");
  ASSERT_GT(beacon.port(), 0);
  // A second beacon's port, once it is closed: nothing listens there, the host answers RST.
  int closed_port = 0;
  {
    PeerBeacon gone("127.0.0.1");
    closed_port = gone.port();
  }
  SilentPort silent;
  const std::vector<PeerAddress> peers{{1, "here", "127.0.0.1", beacon.port()},
                                       {2, "here", "127.0.0.1", closed_port},
                                       {3, "silent", "127.0.0.1", silent.port}};
  const auto start = std::chrono::steady_clock::now();
  const std::vector<bool> answering = peers_answering(peers, 0.5);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(answering[0]);
  EXPECT_TRUE(answering[1]);
  EXPECT_FALSE(answering[2]);
  EXPECT_LT(seconds, 2.0);
  // The beacon keeps answering: it accepts and closes, its queue never fills.
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(peers_answering({peers[0]}, 1.0)[0]) << i;

  const std::string report = partition_report(peers, answering, 0.5);
  EXPECT_NE(report.find("no answer from rank 3 on silent (127.0.0.1) within 0.5 s"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("rank 1"), std::string::npos) << report;
  EXPECT_NE(partition_report(peers, {true, true, true}, 2).find("a peer process is stuck"),
            std::string::npos);
}

TEST(PeerProbe, TheSourceAddressTowardsLoopbackIsLoopbackAndAnUnknownHostGivesNone) {
  EXPECT_EQ(source_address_towards("127.0.0.1", 29500), "127.0.0.1");
  EXPECT_EQ(source_address_towards("no-such-host.invalid", 29500), "");
}

}  // namespace
}  // namespace gpurun
