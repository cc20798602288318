// The fake provider in a fuzz target: one per input, checked clean at the end.
#pragma once

#include "fake_provider.hpp"
#include "fuzz_support.hpp"

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

}  // namespace fuzz
