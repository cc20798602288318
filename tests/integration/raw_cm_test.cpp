// Raw librdmacm (no rpmapp) over the real RDMA stack: proves that the harness
// provides a working rdma_cm before any rpmapp test relies on it.
// Needs $SOFTROCE_IP (set by tools/rpmapp-vm); fails, never skips, without it.
#include "catch2_compat.hpp"

#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>

namespace {

constexpr int event_timeout_ms = 15000;   // generous: the VM may run under TCG
constexpr int resolve_timeout_ms = 5000;

struct ChannelDeleter {
    void operator()(rdma_event_channel* ch) const { rdma_destroy_event_channel(ch); }
};
using Channel = std::unique_ptr<rdma_event_channel, ChannelDeleter>;

// Destroys the id's QP (if any) before the id.
struct IdDeleter {
    void operator()(rdma_cm_id* id) const {
        if (id->qp != nullptr) rdma_destroy_qp(id);
        rdma_destroy_id(id);
    }
};
using Id = std::unique_ptr<rdma_cm_id, IdDeleter>;

std::string errno_text(const char* call) {
    return std::string(call) + " failed: " + std::strerror(errno);
}

Channel make_channel(std::string& err) {
    Channel ch{rdma_create_event_channel()};
    if (!ch) err = errno_text("rdma_create_event_channel");
    return ch;
}

Id make_id(rdma_event_channel* ch, std::string& err) {
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) {
        err = errno_text("rdma_create_id");
        return Id{};
    }
    return Id{id};
}

sockaddr_in ipv4(const char* ip, std::uint16_t port) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1) sa.sin_family = AF_UNSPEC;
    return sa;
}

// Waits (bounded) for the next event on `ch`, which must be `expected`.
// On success returns the event, still to be acknowledged; else sets `err`.
rdma_cm_event* expect_event(rdma_event_channel* ch, rdma_cm_event_type expected,
                            const char* side, std::string& err) {
    const std::string what = std::string(side) + ": waiting for " + rdma_event_str(expected);
    pollfd pfd{ch->fd, POLLIN, 0};
    const int n = poll(&pfd, 1, event_timeout_ms);
    if (n == 0) {
        err = what + ": no event within " + std::to_string(event_timeout_ms) + " ms";
        return nullptr;
    }
    if (n < 0) {
        err = what + ": " + errno_text("poll");
        return nullptr;
    }
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ch, &ev) != 0) {
        err = what + ": " + errno_text("rdma_get_cm_event");
        return nullptr;
    }
    if (ev->event != expected) {
        err = what + ": got " + rdma_event_str(ev->event) + " (status " + std::to_string(ev->status) + ")";
        rdma_ack_cm_event(ev);
        return nullptr;
    }
    return ev;
}

bool expect_and_ack(rdma_event_channel* ch, rdma_cm_event_type expected, const char* side,
                    std::string& err) {
    rdma_cm_event* ev = expect_event(ch, expected, side, err);
    if (ev == nullptr) return false;
    rdma_ack_cm_event(ev);
    return true;
}

bool create_qp(rdma_cm_id* id, std::string& err) {
    ibv_qp_init_attr attr{};
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    // no PD and no CQs given: librdmacm uses the device's default PD and creates the CQs
    if (rdma_create_qp(id, nullptr, &attr) != 0) {
        err = errno_text("rdma_create_qp");
        return false;
    }
    return true;
}

// The client side, run in its own thread: returns "" on success, else what failed.
// It disconnects only once `server_established` is ready: a DREQ sent right after the RTU
// can overtake it (the kernel's CM handles MADs on more than one CPU), and the server's
// rdma_cm then reports DISCONNECTED without ESTABLISHED, which is correct but not what this
// test checks.
std::string run_client(const char* ip, std::uint16_t port, std::shared_future<bool> server_established) {
    std::string err;
    Channel ch = make_channel(err);
    if (!ch) return "client: " + err;
    Id id = make_id(ch.get(), err);
    if (!id) return "client: " + err;
    sockaddr_in dst = ipv4(ip, port);
    if (rdma_resolve_addr(id.get(), nullptr, reinterpret_cast<sockaddr*>(&dst), resolve_timeout_ms) != 0)
        return "client: " + errno_text("rdma_resolve_addr");
    if (!expect_and_ack(ch.get(), RDMA_CM_EVENT_ADDR_RESOLVED, "client", err)) return err;
    if (rdma_resolve_route(id.get(), resolve_timeout_ms) != 0)
        return "client: " + errno_text("rdma_resolve_route");
    if (!expect_and_ack(ch.get(), RDMA_CM_EVENT_ROUTE_RESOLVED, "client", err)) return err;
    if (!create_qp(id.get(), err)) return "client: " + err;
    rdma_conn_param param{};
    param.retry_count = 6;
    param.rnr_retry_count = 6;
    if (rdma_connect(id.get(), &param) != 0) return "client: " + errno_text("rdma_connect");
    if (!expect_and_ack(ch.get(), RDMA_CM_EVENT_ESTABLISHED, "client", err)) return err;
    if (server_established.wait_for(std::chrono::milliseconds(event_timeout_ms)) != std::future_status::ready)
        return "client: the server did not see ESTABLISHED within " + std::to_string(event_timeout_ms) + " ms";
    if (!server_established.get()) return {};   // the server failed: its error is reported
    if (rdma_disconnect(id.get()) != 0) return "client: " + errno_text("rdma_disconnect");
    if (!expect_and_ack(ch.get(), RDMA_CM_EVENT_DISCONNECTED, "client", err)) return err;
    return {};
}

const char* softroce_ip() {
    const char* ip = std::getenv("SOFTROCE_IP");
    if (ip == nullptr || *ip == '\0')
        FAIL("SOFTROCE_IP is not set: run the integration tests on an RDMA device, "
             "e.g. with tools/rpmapp-vm (meson test --suite integration does)");
    return ip;
}

}  // namespace

TEST_CASE("raw librdmacm: connect, establish and disconnect over $SOFTROCE_IP", "[raw_cm]") {
    const char* ip = softroce_ip();
    std::string err;

    Channel ch = make_channel(err);
    if (!ch) FAIL("server: " << err);
    Id listen_id = make_id(ch.get(), err);
    if (!listen_id) FAIL("server: " << err);
    sockaddr_in src = ipv4(ip, 0);   // port 0: the CM assigns one
    if (src.sin_family != AF_INET) FAIL("SOFTROCE_IP is not an IPv4 address: " << ip);
    if (rdma_bind_addr(listen_id.get(), reinterpret_cast<sockaddr*>(&src)) != 0)
        FAIL("server: " << errno_text("rdma_bind_addr") << " (" << ip << ")");
    if (rdma_listen(listen_id.get(), 4) != 0) FAIL("server: " << errno_text("rdma_listen"));
    const std::uint16_t port = ntohs(rdma_get_src_port(listen_id.get()));
    REQUIRE(port != 0);

    // declared after the server's resources: joined (on any exit) before they go
    std::string client_err;
    std::promise<bool> server_established;
    std::jthread client([&, seen = server_established.get_future().share()] { client_err = run_client(ip, port, seen); });
    // set on every way out, so that the client never waits for it in vain
    struct Tell {
        std::promise<bool>& p;
        bool told = false;
        void operator()(bool ok) {
            if (told) return;
            p.set_value(ok);
            told = true;
        }
        ~Tell() { (*this)(false); }
    } tell{server_established};

    rdma_cm_event* req = expect_event(ch.get(), RDMA_CM_EVENT_CONNECT_REQUEST, "server", err);
    if (req == nullptr) FAIL(err);
    Id conn_id{req->id};   // the request's id is ours to destroy (after the ack)
    bool accepted = create_qp(conn_id.get(), err);
    rdma_conn_param param{};
    param.retry_count = 6;
    param.rnr_retry_count = 6;
    if (accepted && rdma_accept(conn_id.get(), &param) != 0) {
        err = errno_text("rdma_accept");
        accepted = false;
    }
    rdma_ack_cm_event(req);
    if (!accepted) FAIL("server: " << err);

    const bool established = expect_and_ack(ch.get(), RDMA_CM_EVENT_ESTABLISHED, "server", err);
    tell(established);
    if (!established) FAIL_CHECK(err);
    else if (!expect_and_ack(ch.get(), RDMA_CM_EVENT_DISCONNECTED, "server", err)) FAIL_CHECK(err);
    // answers the client's disconnect request, so that the client sees DISCONNECTED
    CHECK(rdma_disconnect(conn_id.get()) == 0);

    client.join();
    if (!client_err.empty()) FAIL_CHECK(client_err);
}
