// A provider table that forwards every call to the table installed before it, running a
// hook around each call: for tests that watch or change what happens at the provider seam
// without replacing the fake.
#pragma once

#include <rpmapp/detail/provider.hpp>

#include <optional>

namespace test {

/// Installs, for its lifetime, a table whose every entry makes a `Hook` (a default-constructed
/// object alive during the call) and calls the same entry of the table that was current
/// when the ForwardingProvider was made. One at a time per Hook type.
template <class Hook> class ForwardingProvider {
  using P = rpmapp::detail::Provider;

 public:
  ForwardingProvider() : saved_(target_) {
    target_ = &rpmapp::detail::provider();
    override_.emplace(table);
  }
  ~ForwardingProvider() {
    override_.reset();
    target_ = saved_;
  }
  ForwardingProvider(const ForwardingProvider&) = delete;
  ForwardingProvider& operator=(const ForwardingProvider&) = delete;

  /// The table this one forwards to.
  static const P& target() { return *target_; }

 private:
  template <auto Member> struct Forward;
  template <class R, class... A, R (*P::*Member)(A...)> struct Forward<Member> {
    static R call(A... args) {
      Hook hook;
      return (target_->*Member)(args...);
    }
  };

  static inline const P* target_ = nullptr;
  // Every member of Provider, in order: a new member must be added here too.
  static constexpr P table = {
      &Forward<&P::create_event_channel>::call, &Forward<&P::destroy_event_channel>::call,
      &Forward<&P::create_id>::call,            &Forward<&P::destroy_id>::call,
      &Forward<&P::bind_addr>::call,            &Forward<&P::listen>::call,
      &Forward<&P::resolve_addr>::call,         &Forward<&P::resolve_route>::call,
      &Forward<&P::get_cm_event>::call,         &Forward<&P::ack_cm_event>::call,
      &Forward<&P::migrate_id>::call,           &Forward<&P::create_qp>::call,
      &Forward<&P::destroy_qp>::call,           &Forward<&P::accept>::call,
      &Forward<&P::reject>::call,               &Forward<&P::connect>::call,
      &Forward<&P::disconnect>::call,           &Forward<&P::modify_qp>::call,
      &Forward<&P::get_devices>::call,
      &Forward<&P::free_devices>::call,         &Forward<&P::get_device_list>::call,
      &Forward<&P::free_device_list>::call,     &Forward<&P::alloc_pd>::call,
      &Forward<&P::dealloc_pd>::call,           &Forward<&P::create_comp_channel>::call,
      &Forward<&P::destroy_comp_channel>::call, &Forward<&P::create_cq>::call,
      &Forward<&P::destroy_cq>::call,           &Forward<&P::req_notify_cq>::call,
      &Forward<&P::fcntl>::call,                &Forward<&P::poll>::call,
      &Forward<&P::query_device_ex>::call,      &Forward<&P::reg_mr>::call,
      &Forward<&P::dereg_mr>::call,             &Forward<&P::advise_mr>::call,
      &Forward<&P::create_qp_ex>::call,         &Forward<&P::post_send>::call,
      &Forward<&P::post_recv>::call,            &Forward<&P::post_srq_recv>::call,
      &Forward<&P::post_atomic_write>::call,    &Forward<&P::post_flush>::call,
      &Forward<&P::poll_cq>::call,
      &Forward<&P::get_cq_event>::call,         &Forward<&P::ack_cq_events>::call,
      &Forward<&P::create_srq>::call,           &Forward<&P::destroy_srq>::call,
      &Forward<&P::alloc_mw>::call,             &Forward<&P::dealloc_mw>::call,
      &Forward<&P::getrandom>::call,
      &Forward<&P::epoll_create1>::call,        &Forward<&P::epoll_ctl>::call,
      &Forward<&P::epoll_wait>::call,           &Forward<&P::eventfd>::call,
      &Forward<&P::read>::call,                 &Forward<&P::write>::call,
      &Forward<&P::close>::call,
      &Forward<&P::pthread_create>::call,
  };
  const P* saved_;
  std::optional<rpmapp::detail::ProviderOverride> override_;
};

}  // namespace test
