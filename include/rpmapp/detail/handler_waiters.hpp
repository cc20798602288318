// The handler registrations of an EventLoop (serve, watch, resolve, watch_completions,
// watch_fd): one Waiter per registration, owned by its Registration.
#pragma once

#include <rpmapp/conn.hpp>
#include <rpmapp/conn_req.hpp>
#include <rpmapp/cq.hpp>
#include <rpmapp/detail/loop_awaiters.hpp>
#include <rpmapp/detail/loop_core.hpp>
#include <rpmapp/endpoint.hpp>
#include <rpmapp/error.hpp>
#include <rpmapp/shared_cq.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

// Requests (or events) handled per wake-up of one source, so one busy source cannot starve
// the others (the fd stays readable: the rest come in the next round).
inline constexpr int per_round = 16;
// Completions per watch_completions batch.
inline constexpr std::size_t completion_batch = 16;

/// A handler registration, owned by its Registration: deleted by it, or by the loop after
/// the dispatch in which its own handler released it.
/// Its flags, `dispatching` and `orphaned`, are in Waiter.
struct HandlerWaiter : Waiter {

  virtual ~HandlerWaiter() = default;
  /// Calls the handler(s) for `events`; exceptions leave through here.
  virtual void handle(std::uint32_t events) = 0;

  /// Still able to call its handler: registered in a loop, its source alive.
  virtual bool active() const noexcept { return watching(); }

  // RPMAPP_DECL on the declarations of virtual functions defined in impl/: inline in
  // header-only mode, else an includer takes one for the class's key function and emits
  // the vtables and every handle() whether it uses the loop or not.
  RPMAPP_DECL void ready(std::uint32_t events) final;
  /// The Registration lets go.
  void release() noexcept;
  /// Released by its own handler, or its source or loop is gone: stop handling.
  bool done() const noexcept { return orphaned || !watching(); }
  void source_gone() noexcept override {
    if (loop != nullptr) loop->remove(*this);
  }
  void loop_gone() noexcept override { loop = nullptr; }
};

struct ServeWaiter final : detail::HandlerWaiter {
  explicit ServeWaiter(const ConnConfig& cfg) noexcept : config(cfg) {}
  detail::ListenerState* listener = nullptr;
  detail::KeptConfig config;
  std::shared_ptr<ConnReqHandler> shared_handler;
  ConnReqHandler handler;
  bool active() const noexcept override { return watching() && link != nullptr; }
  RPMAPP_DECL void handle(std::uint32_t) override;
};

struct ConnWaiter final : detail::HandlerWaiter {
  detail::ConnectionCore* core = nullptr;
  std::function<void(expected<ConnEvent>)> handler;
  bool active() const noexcept override { return watching() && link != nullptr; }
  // The connection was found lost by its completions: no fd says so.
  void source_signalled() noexcept override {
    if (loop != nullptr) loop->post_signal(*this);
  }
  RPMAPP_DECL void handle(std::uint32_t) override;
};

struct ResolveWaiter final : detail::HandlerWaiter {
  explicit ResolveWaiter(PendingConnReq&& p) noexcept : pending(std::move(p)) {}
  PendingConnReq pending;
  std::function<void(expected<ConnReq>)> handler;
  RPMAPP_DECL void handle(std::uint32_t) override;
};

struct CompletionWaiter final : detail::HandlerWaiter {
  detail::ConnectionCore* core = nullptr;  // valid while active (its Conn tells it first)
  bool receive = false;
  std::function<void(expected<std::span<const ibv_wc>>)> handler;
  bool active() const noexcept override { return watching() && link != nullptr; }

  // Takes the channel's events, re-arms, and polls the queue(s) empty: the channel raises
  // no new event for what is already queued, so a drain cut short (the round's budget, the
  // handler throwing, ibv_poll_cq failing, a queue left unarmed) makes the waiter due
  // again in the next round without one (post_next_round). EIO from ibv_get_cq_event (the
  // device is gone: the channel delivers nothing more) ends the registration.
  RPMAPP_DECL void handle(std::uint32_t) override;
};

/// EventLoop::watch_completions on a SharedCq: as CompletionWaiter, each batch tagged with
/// its connections. Holds the queue while registered (the SharedCq handle may go).
struct SharedCompletionWaiter final : detail::HandlerWaiter {
  std::shared_ptr<SharedCqState> shared;
  std::function<void(expected<std::span<const ibv_wc>>, std::span<const ConnId>)> handler;
  RPMAPP_DECL void handle(std::uint32_t) override;
};

struct FdWaiter final : detail::HandlerWaiter {
  std::function<void(std::uint32_t)> handler;
  void handle(std::uint32_t events) override {
    handler(events);
  }
};

}  // namespace detail
RPMAPP_END_NAMESPACE

#if !defined(RPMAPP_SEPARATE_COMPILATION)
#  include <rpmapp/impl/detail_handler_waiters.ipp>
#endif
