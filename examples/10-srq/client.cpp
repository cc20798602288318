// 10-srq, client: sends one message to the server, which receives it through its shared
// receive queue. Nothing on this side knows about the queue.
#include "../common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/core.h>

#include <unistd.h>

#include <array>
#include <string>

int main(int argc, char** argv) {
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::remote);
  if (!peer) return example::fail(peer.error());
  // The pid tells the clients apart in the server's output.
  const std::string message = fmt::format("hello from the 10-srq client, pid {}", getpid());
  std::array<std::byte, 64> memory{};
  std::memcpy(memory.data(), message.data(), message.size());
  auto mr = rpmapp::MrLocal::reg(*peer, memory, rpmapp::MrUsage::send);
  if (!mr) return example::fail(mr.error());

  auto conn = example::connect_with_retry(*peer, addr, port, {});
  if (!conn) return example::fail(conn.error());
  if (auto ok = conn->send(*mr, 0, message.size() + 1); !ok) return example::fail(ok.error());
  auto cq = conn->cq();
  if (!cq) return example::fail(cq.error());
  if (auto wc = example::next_completion(*cq, IBV_WC_SEND); !wc) return example::fail(wc.error());
  fmt::print("sent \"{}\"\n", message);

  if (auto ok = example::disconnect_and_close(*conn); !ok) return example::fail(ok.error());
  return 0;
}
