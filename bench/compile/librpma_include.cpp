// Benchmark 5 (compile cost): only the includes librpma users need.
#include <librpma.h>
#include <rdma/rdma_cma.h>
