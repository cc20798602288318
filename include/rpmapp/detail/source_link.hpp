// The link between a source (a connection's core, an Endpoint handle) and whatever an
// event loop is waiting on it for (a handler registration, an awaiting coroutine): when the
// source goes away, each of them is told first, while the source's fds are still open, so
// that it leaves the loop's epoll set and (for a coroutine) is resumed with an error.
#pragma once

#include <rpmapp/version.hpp>

#include <utility>

RPMAPP_BEGIN_NAMESPACE
namespace detail {

class SourceLink;
/// The event loop's access to the sources' internals (event_loop.hpp).
struct LoopAccess;

/// Something waiting on a source. Single-threaded: a source watched by a loop is used on
/// that loop's thread.
struct SourceWatcher {
  SourceLink* link = nullptr;
  SourceWatcher* next_watcher = nullptr;
  /// The source is going away (its link has already dropped this watcher).
  virtual void source_gone() noexcept = 0;
  /// The source has news that no fd announces (a connection found lost by its completions):
  /// look at it again soon, from the loop, not from inside this call.
  virtual void source_signalled() noexcept {}
  /// An event for the connection it waits on was routed to its inbox (a shared event
  /// channel, EventRoutes): look at it soon, from the loop.
  virtual void events_routed() noexcept {}

 protected:
  SourceWatcher() = default;
  SourceWatcher(const SourceWatcher&) = delete;
  SourceWatcher& operator=(const SourceWatcher&) = delete;
  ~SourceWatcher() = default;
};

/// A source's list of watchers. Moving it moves the watchers along (a moved Endpoint is
/// still the same listener handle); destroying it, or notify(), tells them the source is
/// gone.
class SourceLink {
 public:
  SourceLink() = default;
  SourceLink(SourceLink&& other) noexcept : head_(std::exchange(other.head_, nullptr)) { adopt(); }
  SourceLink& operator=(SourceLink&& other) noexcept {
    if (this != &other) {
      notify();
      head_ = std::exchange(other.head_, nullptr);
      adopt();
    }
    return *this;
  }
  ~SourceLink() { notify(); }

  void attach(SourceWatcher& w) noexcept {
    w.link = this;
    w.next_watcher = head_;
    head_ = &w;
  }
  void detach(SourceWatcher& w) noexcept {
    for (SourceWatcher** at = &head_; *at != nullptr; at = &(*at)->next_watcher)
      if (*at == &w) {
        *at = w.next_watcher;
        break;
      }
    w.link = nullptr;
    w.next_watcher = nullptr;
  }
  bool watched() const noexcept { return head_ != nullptr; }

  /// Tells every watcher that the source has news (they stay attached).
  void signal() noexcept {
    for (SourceWatcher* w = head_; w != nullptr; w = w->next_watcher) w->source_signalled();
  }

  /// Tells every watcher that the source is going away (each is detached before it is told,
  /// so it may destroy itself or watch something else).
  void notify() noexcept {
    while (head_ != nullptr) {
      SourceWatcher* w = head_;
      head_ = w->next_watcher;
      w->link = nullptr;
      w->next_watcher = nullptr;
      w->source_gone();
    }
  }

 private:
  void adopt() noexcept {
    for (SourceWatcher* w = head_; w != nullptr; w = w->next_watcher) w->link = this;
  }
  SourceWatcher* head_ = nullptr;
};

}  // namespace detail
RPMAPP_END_NAMESPACE
