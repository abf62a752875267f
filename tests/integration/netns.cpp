#include "integration/netns.h"

#include <unistd.h>

#include <filesystem>
#include <stdexcept>

namespace gpurun::test {
namespace {

std::string tool(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"})
    if (access((dir + name).c_str(), X_OK) == 0) return dir + name;
  return "";
}

}  // namespace

TwoNodes::TwoNodes() : tag_(std::to_string(getpid())) {
  if (geteuid() != 0) {
    why_ = "network namespaces need root";
    return;
  }
  if (tool("ip").empty() || tool("unshare").empty()) {
    why_ = "`ip` (iproute2) or `unshare` (util-linux) is not installed";
    return;
  }
  try {
    ip({"netns", "add", ns(0)});
    ip({"netns", "add", ns(1)});
    ip({"link", "add", veth(0), "type", "veth", "peer", "name", veth(1)});
    for (int n : {0, 1}) {
      ip({"link", "set", veth(n), "netns", ns(n)});
      ip({"-n", ns(n), "addr", "add", address(n) + "/24", "dev", veth(n)});
      ip({"-n", ns(n), "link", "set", "lo", "up"});
      ip({"-n", ns(n), "link", "set", veth(n), "up"});
    }
    ok_ = true;
  } catch (const std::exception& e) {
    why_ = std::string("cannot make two network namespaces here: ") + e.what();
  }
}

TwoNodes::~TwoNodes() {
  for (int n : {0, 1}) run_program({tool("ip"), "netns", "del", ns(n)}, 10);
}

bool TwoNodes::has_nft() const { return !tool("nft").empty(); }

std::string TwoNodes::address(int node) { return node == 0 ? "10.233.0.1" : "10.233.0.2"; }
std::string TwoNodes::host(int node) const { return "node-" + tag_ + "-" + std::to_string(node); }
std::string TwoNodes::ns(int node) const { return "gpurun" + tag_ + "n" + std::to_string(node); }
// Interface names have at most 15 characters.
std::string TwoNodes::veth(int node) const { return "gr" + tag_ + "v" + std::to_string(node); }

pid_t TwoNodes::start(int node, const std::vector<std::string>& argv, const std::string& log_prefix,
                      const Env& env) const {
  // `ip netns exec` and `unshare` exec what follows, and the shell execs argv: the pid returned
  // is argv[0]'s own.
  std::vector<std::string> wrapped{tool("ip"),
                                   "netns",
                                   "exec",
                                   ns(node),
                                   tool("unshare"),
                                   "--uts",
                                   "/bin/sh",
                                   "-c",
                                   "hostname \"$0\" && exec \"$@\"",
                                   host(node)};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return start_program(wrapped, log_prefix, env);
}

void TwoNodes::link_down(int node) const {
  ip({"-n", ns(node), "link", "set", veth(node), "down"});
}
void TwoNodes::link_up(int node) const { ip({"-n", ns(node), "link", "set", veth(node), "up"}); }

void TwoNodes::drop_from_peer(int node) const {
  nft(node, {"add", "table", "inet", "gpurun_test"});
  nft(node, {"add", "chain", "inet", "gpurun_test", "input",
             "{ type filter hook input priority 0; policy accept; }"});
  nft(node,
      {"add", "rule", "inet", "gpurun_test", "input", "ip", "saddr", address(1 - node), "drop"});
}

void TwoNodes::undrop(int node) const { nft(node, {"delete", "table", "inet", "gpurun_test"}); }

void TwoNodes::ip(const std::vector<std::string>& args) const {
  std::vector<std::string> argv{tool("ip")};
  argv.insert(argv.end(), args.begin(), args.end());
  const Result r = run_program(argv, 30);
  if (r.exit_code != 0) throw std::runtime_error("ip " + args[0] + " ...: " + r.err);
}

void TwoNodes::nft(int node, const std::vector<std::string>& args) const {
  std::vector<std::string> argv{tool("ip"), "netns", "exec", ns(node), tool("nft")};
  argv.insert(argv.end(), args.begin(), args.end());
  const Result r = run_program(argv, 30);
  if (r.exit_code != 0) throw std::runtime_error("nft " + args[0] + " ...: " + r.err);
}

}  // namespace gpurun::test
