// rpmapp grant server, for the interop tests (its client is librpma_grant_client): a
// region registered with MrScope::grants (its own key reaches nothing) holding a text;
// once the connection is established it grants the client reads and writes of the region
// and sends the grant's descriptor in a message. The client reads the text and writes its
// own at write_offset through it, then says so in a message; the server prints
// `written: "<text>"`, revokes the grant, tells the client, and waits for it to
// disconnect. Built with RPMAPP_GRANT_BY_REGISTRATION=1 the grant is a registration of the
// range (MrScope::grants_by_registration) instead of rxe's memory window.
#include "../../../examples/common/common.hpp"

#include <rpmapp/rpmapp.hpp>

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <string_view>

#ifndef RPMAPP_GRANT_BY_REGISTRATION
#define RPMAPP_GRANT_BY_REGISTRATION 0
#endif

constexpr std::string_view text = "granted by rpmapp";
constexpr std::size_t write_offset = 512;  // where the client writes
// the message region: the descriptor goes out from 0, the client's note lands at 64
constexpr std::size_t note_offset = 64, note_size = 16;

int main(int argc, char** argv) {
  constexpr bool by_registration = RPMAPP_GRANT_BY_REGISTRATION != 0;
  std::string_view addr, port;
  if (!example::parse_args(argc, argv, addr, port)) return 2;

  auto peer = rpmapp::Peer::from_address(addr, rpmapp::AddressKind::local);
  if (!peer) return example::fail(peer.error());
  std::array<char, 1024> memory{};
  std::memcpy(memory.data(), text.data(), text.size());
  auto mr = rpmapp::MrLocal::reg(*peer, memory.data(), memory.size(),
                                 rpmapp::MrUsage::read_src | rpmapp::MrUsage::write_dst,
                                 by_registration ? rpmapp::MrScope::grants_by_registration
                                                 : rpmapp::MrScope::grants);
  if (!mr) return example::fail(mr.error());
  std::array<std::byte, note_offset + note_size> messages{};
  auto messages_mr = rpmapp::MrLocal::reg(*peer, messages.data(), messages.size(),
                                          rpmapp::MrUsage::send | rpmapp::MrUsage::recv);
  if (!messages_mr) return example::fail(messages_mr.error());

  auto endpoint = example::listen_and_print(*peer, addr, port);
  if (!endpoint) return example::fail(endpoint.error());
  // the client's note finds its receive posted before the accept
  auto conn = example::accept_next(*endpoint, {}, [&](rpmapp::ConnReq& req) {
    return req.recv(*messages_mr, note_offset, note_size);
  });
  if (!conn) return example::fail(conn.error());
  auto cq = conn->cq();
  if (!cq) return example::fail(cq.error());

  // the grant, then its descriptor in a message on the same connection
  auto grant = rpmapp::Grant::make(*conn, *mr, 0, memory.size(),
                                   rpmapp::MrUsage::read_src | rpmapp::MrUsage::write_dst);
  if (!grant) return example::fail(grant.error());
  const bool windows = *mr->grant_mode() == rpmapp::GrantMode::windows;
  if (windows)
    if (auto bound = example::next_completion(*cq, IBV_WC_BIND_MW); !bound) return example::fail(bound.error());
  if (auto written = grant->write_descriptor(std::span(messages).first(rpmapp::mr_descriptor_size)); !written)
    return example::fail(written.error());
  if (auto ok = conn->send(*messages_mr, 0, rpmapp::mr_descriptor_size, rpmapp::Completion::always); !ok)
    return example::fail(ok.error());
  if (auto sent = example::next_completion(*cq, IBV_WC_SEND); !sent) return example::fail(sent.error());
  fmt::print("granted by {}: {} bytes\n", windows ? "a memory window" : "a registration", memory.size());

  // the client's note: its write has completed
  if (auto note = example::next_completion(*cq, IBV_WC_RECV); !note) return example::fail(note.error());
  if (std::memchr(memory.data() + write_offset, '\0', memory.size() - write_offset) == nullptr)
    return example::fail(rpmapp::Error(rpmapp::errc::inval, 0, "rpmapp grant server",
                                       "the region holds no NUL-terminated text at the write offset"));
  fmt::print("written: \"{}\"\n", memory.data() + write_offset);

  // revoked, then the client is told so (it then reads through the old descriptor)
  if (auto ok = std::move(*grant).revoke(); !ok) return example::fail(ok.error());
  if (auto ok = conn->send(*messages_mr, 0, 1, rpmapp::Completion::always); !ok) return example::fail(ok.error());
  // The client acts on the message at once: its read through the revoked grant moves this
  // queue pair to the error state, which may come before the send's acknowledgement does
  // (then the send completes as flushed, though it was delivered).
  ibv_wc sent{};
  if (auto got = cq->next_for(std::span(&sent, 1), example::wait_bound); !got) return example::fail(got.error());
  if (sent.status != IBV_WC_SUCCESS && sent.status != IBV_WC_WR_FLUSH_ERR)
    return example::fail(rpmapp::Error(rpmapp::errc::provider, 0, "rpmapp grant server",
                                       fmt::format("the revoked message completed with {}", rpmapp::to_string(sent.status))));
  fmt::print("revoked\n");

  if (auto ok = example::wait_closed_by_client(*conn); !ok) return example::fail(ok.error());
  if (auto ok = std::move(*messages_mr).dereg(); !ok) return example::fail(ok.error());
  if (auto ok = example::close_server(std::move(*conn), std::move(*mr), std::move(*endpoint)); !ok)
    return example::fail(ok.error());
  return 0;
}
