// Benchmark 5 (compile cost): the floor. Exactly the headers rpmapp's public headers
// include from outside rpmapp (standard, POSIX, rdma-core, fmt, tl-expected) in the mode it
// is compiled in (header-only, or -DRPMAPP_SEPARATE_COMPILATION), so that
// rpmapp_include / deps_include is what rpmapp's own code costs on top of its
// dependencies. bench/run checks (g++ -H) that both include the same headers.
#include <version>
#if defined(__cpp_lib_expected) && __cpp_lib_expected >= 202202L
#include <expected>
#else
#include <tl/expected.hpp>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <compare>
#include <condition_variable>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#if !defined(RPMAPP_SEPARATE_COMPILATION)  // only the definitions use them
#include <ifaddrs.h>
#include <net/if.h>
#endif
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <fmt/core.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
