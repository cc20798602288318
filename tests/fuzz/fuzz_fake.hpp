// The fake provider in a fuzz target: one per input, checked clean at the end.
#pragma once

#include "fake_provider.hpp"
#include "fuzz_support.hpp"

#include <rpmapp/peer.hpp>

#include <utility>

namespace fuzz {

/// Every cm_id, channel, fd, queue... the fake handed out was released, and the fake
/// recorded no misuse (destroying with unacknowledged events, a blocking read that hung...).
inline void check_clean(const fake::FakeProvider& fake) {
  const std::string problems = fake.problems();
  if (!problems.empty()) {
    std::string calls;
    for (const auto& c : fake.calls()) calls += c + " ";
    broken(__FILE__, __LINE__, "the fake provider is clean", problems + "calls: " + calls);
  }
}

/// A Peer on the fake's first device (opening it cannot fail on a fresh fake).
inline rpmapp::Peer open_peer(fake::FakeProvider& fake) {
  auto peer = rpmapp::Peer::open(fake.context(0));
  FUZZ_CHECK_MSG(peer.has_value(), peer.error().message());
  return std::move(*peer);
}

}  // namespace fuzz
