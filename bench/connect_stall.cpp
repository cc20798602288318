// How long the active side's rdma_connect (inside ConnReq::connect) holds its thread, per
// transport: siw makes its TCP connection inside that call, rxe only sends the CM's
// request. What an EventLoop connecting on the device stalls for (docs/task.md). Not a
// comparison with librpma: rpma_conn_req_connect makes the same call.
//   - answered: N connects to a listener on the device, median and largest time;
//   - refused: one connect to a port nobody listens on, its time and its outcome;
//   - unanswered (with --unanswered): one connect to an address on the device's link that
//     nobody has (the VM's netdevs are dummies: nothing answers), its time, then how long
//     until the connection's event. Takes minutes: net.ipv4.tcp_syn_retries decides siw's.
// Usage (in the VM): connect_stall [--unanswered] [N]
//   reads SOFTROCE_IP (rxe0) and SOFTROCE_IWARP_IP (siw0); either may be unset.
#include <rpmapp/rpmapp.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds event_wait{5000};

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string outcome(const rpmapp::expected<rpmapp::Conn>& conn) {
  return conn ? std::string("connected") : conn.error().message();
}

// One connection to `ep`, made and closed; the time rdma_connect took, or a negative value.
double timed_connect(const rpmapp::Peer& peer, const std::string& ip, rpmapp::Endpoint& ep) {
  const std::string port = std::to_string(ep.port().value_or(0));
  auto req = rpmapp::ConnReq::to(peer, ip, port);
  if (!req) return std::printf("ConnReq::to: %s\n", req.error().message().c_str()), -1;
  const auto start = Clock::now();
  auto client = std::move(*req).connect();
  const double took = ms_since(start);
  if (!client) return std::printf("connect: %s\n", client.error().message().c_str()), -1;
  auto request = ep.next_conn_req_for(event_wait);
  if (!request) return std::printf("next_conn_req_for: %s\n", request.error().message().c_str()), -1;
  auto server = std::move(*request).connect();
  if (!server) return std::printf("accept: %s\n", server.error().message().c_str()), -1;
  // the client's event first: on IB/RoCE it sends the handshake's last message
  if (!client->next_event_for(event_wait) || !server->next_event_for(event_wait))
    return std::printf("no established event\n"), -1;
  (void)client->disconnect();
  (void)server->disconnect();
  (void)client->next_event_for(event_wait);
  (void)server->next_event_for(event_wait);
  (void)std::move(*client).close();
  (void)std::move(*server).close();
  return took;
}

// The same /24 as `ip`, host 9: on the VM's dummy netdevs nobody has it.
std::string unanswered_address(const std::string& ip) { return ip.substr(0, ip.rfind('.') + 1) + "9"; }

int measure(const char* variable, int n, bool unanswered) {
  const char* ip_env = std::getenv(variable);
  if (ip_env == nullptr) return std::printf("%s is unset: skipped\n", variable), 0;
  const std::string ip = ip_env;
  auto peer = rpmapp::Peer::from_address(ip, rpmapp::AddressKind::local);
  if (!peer) return std::printf("Peer::from_address(%s): %s\n", ip.c_str(), peer.error().message().c_str()), 1;
  const std::string device = peer->device_name().value_or("?");
  auto ep = rpmapp::Endpoint::listen(*peer, ip, "0");
  if (!ep) return std::printf("listen: %s\n", ep.error().message().c_str()), 1;

  std::vector<double> times;
  for (int i = 0; i < n; ++i) {
    const double took = timed_connect(*peer, ip, *ep);
    if (took < 0) return 1;
    times.push_back(took);
  }
  std::sort(times.begin(), times.end());
  std::printf("%s answered: %d connects, rdma_connect median %.2f ms, largest %.2f ms\n", device.c_str(), n,
              times[times.size() / 2], times.back());

  auto refused_req = rpmapp::ConnReq::to(*peer, ip, "1");  // nobody listens on port 1
  if (!refused_req) return std::printf("ConnReq::to: %s\n", refused_req.error().message().c_str()), 1;
  auto start = Clock::now();
  auto refused = std::move(*refused_req).connect();
  std::printf("%s refused: rdma_connect %.2f ms: %s", device.c_str(), ms_since(start), outcome(refused).c_str());
  if (refused) {
    auto event = refused->next_event_for(event_wait);
    std::printf(", then %s", event ? std::string(rpmapp::to_string(*event)).c_str() : event.error().message().c_str());
  }
  std::printf("\n");
  if (!unanswered) return 0;

  const std::string nobody = unanswered_address(ip);
  auto lost_req = rpmapp::ConnReq::to(*peer, nobody, "7471");
  if (!lost_req) return std::printf("ConnReq::to(%s): %s\n", nobody.c_str(), lost_req.error().message().c_str()), 1;
  start = Clock::now();
  auto lost = std::move(*lost_req).connect();
  std::printf("%s unanswered (%s): rdma_connect %.0f ms: %s", device.c_str(), nobody.c_str(), ms_since(start),
              outcome(lost).c_str());
  if (lost) {
    start = Clock::now();
    auto event = lost->next_event_for(std::chrono::minutes(5));
    std::printf(", then after %.0f ms: %s", ms_since(start),
                event ? std::string(rpmapp::to_string(*event)).c_str() : event.error().message().c_str());
  }
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool unanswered = false;
  int n = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--unanswered") unanswered = true;
    else n = std::max(1, std::atoi(argv[i]));
  }
  std::string retries = "?";
  std::ifstream("/proc/sys/net/ipv4/tcp_syn_retries") >> retries;
  std::printf("connect_stall: net.ipv4.tcp_syn_retries = %s\n", retries.c_str());
  const int rxe = measure("SOFTROCE_IP", n, unanswered);
  const int siw = measure("SOFTROCE_IWARP_IP", n, unanswered);
  return rxe != 0 || siw != 0 ? 1 : 0;
}
