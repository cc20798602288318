// Benchmark 5 (compile cost): only the include, as a user TU that names nothing yet.
#include <rpmapp/rpmapp.hpp>
