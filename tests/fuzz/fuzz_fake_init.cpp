// libFuzzer's start-up hook for the targets that run the fake provider (one definition,
// linked into each of them: a weak symbol is not taken from a static library).
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::check_logs();
  return 0;
}
