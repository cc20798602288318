// The kernel resource ledger of a process: its open fds (/proc/PID/fd) and the RDMA
// objects the kernel holds for it (cm_ids, QPs, CQs, MRs, PDs, device contexts, SRQs).
// A fault scenario records it before and after and fails on any difference. Only
// meaningful on a machine with RDMA devices (the VM); on the host every RDMA count is 0.
//
// The RDMA counts come straight from the kernel's resource tracker over one RDMA netlink
// socket (NETLINK_RDMA, the nldev RES_*_GET dumps, one per device and kind), the same
// source `rdma resource show KIND` (iproute2) prints; running that tool once per kind took
// seconds per read under TCG. rdma_tool_counts() still runs the tool, for the test that
// keeps both equal (ledger_test).
#pragma once

#include <linux/netlink.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_netlink.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace reliability {

// The RDMA object kinds `rdma resource show` knows, in ledger order.
inline constexpr std::array<std::string_view, 7> rdma_kinds{"cm_id", "qp",  "cq", "mr",
                                                            "pd",    "ctx", "srq"};

// Sets of rdma_kinds for the readers below: bit i is rdma_kinds[i].
inline constexpr std::uint32_t all_rdma_kinds = (1u << rdma_kinds.size()) - 1;
inline constexpr std::uint32_t without_srqs = all_rdma_kinds & ~(1u << 6);
static_assert(rdma_kinds[6] == "srq");

struct Ledger {
  long fds = 0;
  std::array<long, rdma_kinds.size()> rdma{};  // indexed like rdma_kinds

  friend bool operator==(const Ledger&, const Ledger&) = default;

  // "fds 7 cm_id 1 qp 0 cq 0 mr 0 pd 0 ctx 0 srq 0"
  std::string to_string() const {
    std::string text = "fds " + std::to_string(fds);
    for (std::size_t i = 0; i < rdma_kinds.size(); ++i)
      text += " " + std::string(rdma_kinds[i]) + " " + std::to_string(rdma[i]);
    return text;
  }
  long count(std::string_view kind) const {
    if (kind == "fds") return fds;
    for (std::size_t i = 0; i < rdma_kinds.size(); ++i)
      if (rdma_kinds[i] == kind) return rdma[i];
    throw std::invalid_argument("no ledger kind " + std::string(kind));
  }
};

// "cm_id +1 fds +3" (only what differs), or "" when equal.
inline std::string ledger_diff(const Ledger& before, const Ledger& after) {
  std::string text;
  auto add = [&](std::string_view kind, long b, long a) {
    if (a == b) return;
    if (!text.empty()) text += ' ';
    text += std::string(kind) + (a > b ? " +" : " ") + std::to_string(a - b);
  };
  add("fds", before.fds, after.fds);
  for (std::size_t i = 0; i < rdma_kinds.size(); ++i)
    add(rdma_kinds[i], before.rdma[i], after.rdma[i]);
  return text;
}

namespace detail {

// Open fds of `pid`, not counting the one used to read the directory.
inline long count_fds(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd";
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) throw std::system_error(errno, std::generic_category(), "opendir " + path);
  long n = 0;
  while (const dirent* entry = ::readdir(dir))
    if (entry->d_name[0] != '.') ++n;
  const bool self = pid == ::getpid();
  ::closedir(dir);
  return self ? n - 1 : n;
}

// How the kernel's nldev interface dumps one kind: the command, the nested table in each
// reply and the nested entry per object inside it. Indexed like rdma_kinds.
struct NldevKind {
  std::uint16_t command;
  std::uint16_t table;
  std::uint16_t entry;
  const char* command_name;  // for error messages
};
inline constexpr std::array<NldevKind, rdma_kinds.size()> nldev_kinds{{
    {RDMA_NLDEV_CMD_RES_CM_ID_GET, RDMA_NLDEV_ATTR_RES_CM_ID, RDMA_NLDEV_ATTR_RES_CM_ID_ENTRY,
     "RDMA_NLDEV_CMD_RES_CM_ID_GET"},
    {RDMA_NLDEV_CMD_RES_QP_GET, RDMA_NLDEV_ATTR_RES_QP, RDMA_NLDEV_ATTR_RES_QP_ENTRY,
     "RDMA_NLDEV_CMD_RES_QP_GET"},
    {RDMA_NLDEV_CMD_RES_CQ_GET, RDMA_NLDEV_ATTR_RES_CQ, RDMA_NLDEV_ATTR_RES_CQ_ENTRY,
     "RDMA_NLDEV_CMD_RES_CQ_GET"},
    {RDMA_NLDEV_CMD_RES_MR_GET, RDMA_NLDEV_ATTR_RES_MR, RDMA_NLDEV_ATTR_RES_MR_ENTRY,
     "RDMA_NLDEV_CMD_RES_MR_GET"},
    {RDMA_NLDEV_CMD_RES_PD_GET, RDMA_NLDEV_ATTR_RES_PD, RDMA_NLDEV_ATTR_RES_PD_ENTRY,
     "RDMA_NLDEV_CMD_RES_PD_GET"},
    {RDMA_NLDEV_CMD_RES_CTX_GET, RDMA_NLDEV_ATTR_RES_CTX, RDMA_NLDEV_ATTR_RES_CTX_ENTRY,
     "RDMA_NLDEV_CMD_RES_CTX_GET"},
    {RDMA_NLDEV_CMD_RES_SRQ_GET, RDMA_NLDEV_ATTR_RES_SRQ, RDMA_NLDEV_ATTR_RES_SRQ_ENTRY,
     "RDMA_NLDEV_CMD_RES_SRQ_GET"},
}};

// Netlink attributes in [data, data + size): calls on_attr(type, payload, payload_size)
// for each; false when the attributes do not add up (a malformed reply).
template <class OnAttr>
bool for_each_attr(const unsigned char* data, std::size_t size, OnAttr on_attr) {
  while (size >= NLA_HDRLEN) {
    nlattr attr;
    std::memcpy(&attr, data, sizeof attr);
    if (attr.nla_len < NLA_HDRLEN || attr.nla_len > size) return false;
    on_attr(static_cast<std::uint16_t>(attr.nla_type & NLA_TYPE_MASK), data + NLA_HDRLEN,
            std::size_t{attr.nla_len} - NLA_HDRLEN);
    const std::size_t step = NLA_ALIGN(attr.nla_len);
    if (step >= size) return true;
    data += step;
    size -= step;
  }
  return size == 0;
}

// One NETLINK_RDMA socket for one ledger read (closed again before fds are counted).
// Errors throw std::system_error (the command, the device and errno) or
// std::runtime_error (a reply this code cannot read).
class NldevSocket {
 public:
  NldevSocket() : fd_(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_RDMA)) {
    if (fd_ < 0)
      throw std::system_error(errno, std::generic_category(),
                              "socket(AF_NETLINK, NETLINK_RDMA) (a kernel without RDMA support?)");
    // The kernel answers at once; a missing answer must fail the read, not hang it.
    const timeval timeout{5, 0};
    if (::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) != 0) {
      const int error = errno;
      ::close(fd_);
      throw std::system_error(error, std::generic_category(), "setsockopt(SO_RCVTIMEO) on the RDMA netlink socket");
    }
  }
  NldevSocket(const NldevSocket&) = delete;
  NldevSocket& operator=(const NldevSocket&) = delete;
  ~NldevSocket() { ::close(fd_); }

  // Dumps nldev `command` (of device index `device` when given) and calls
  // on_message(attrs, size) with the attributes of every reply message.
  template <class OnMessage>
  void dump(std::uint16_t command, const char* command_name, std::optional<std::uint32_t> device,
            OnMessage on_message) {
    const std::string what = std::string("RDMA netlink ") + command_name + " dump" +
                             (device ? " of device index " + std::to_string(*device) : "");
    send_request(command, device, what);
    for (;;) {
      const std::size_t size = receive(what);
      const unsigned char* at = buffer_.data();
      std::size_t left = size;
      while (left >= NLMSG_HDRLEN) {
        nlmsghdr header;
        std::memcpy(&header, at, sizeof header);
        if (header.nlmsg_len < NLMSG_HDRLEN || header.nlmsg_len > left)
          throw std::runtime_error(what + ": malformed reply (message length " +
                                   std::to_string(header.nlmsg_len) + ")");
        const unsigned char* payload = at + NLMSG_HDRLEN;
        const std::size_t payload_size = header.nlmsg_len - NLMSG_HDRLEN;
        if (header.nlmsg_seq == seq_) {
          if (header.nlmsg_type == NLMSG_DONE) {
            int status = 0;  // a dump that failed after it started ends with -errno here
            if (payload_size >= sizeof status) std::memcpy(&status, payload, sizeof status);
            if (status < 0) throw std::system_error(-status, std::generic_category(), what);
            return;
          }
          if (header.nlmsg_type == NLMSG_ERROR) {
            nlmsgerr error{};
            if (payload_size >= sizeof error.error) std::memcpy(&error.error, payload, sizeof error.error);
            if (error.error < 0) throw std::system_error(-error.error, std::generic_category(), what);
            return;  // an acknowledgement: nothing more follows
          }
          if (!on_message(payload, payload_size))
            throw std::runtime_error(what + ": malformed attributes in a reply");
        }
        const std::size_t step = NLMSG_ALIGN(header.nlmsg_len);
        if (step >= left) break;
        at += step;
        left -= step;
      }
    }
  }

 private:
  void send_request(std::uint16_t command, std::optional<std::uint32_t> device, const std::string& what) {
    unsigned char request[NLMSG_HDRLEN + NLA_HDRLEN + sizeof(std::uint32_t)] = {};
    nlmsghdr header{};
    header.nlmsg_len = NLMSG_HDRLEN + (device ? NLA_HDRLEN + sizeof(std::uint32_t) : 0);
    header.nlmsg_type = static_cast<std::uint16_t>(RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, command));
    header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.nlmsg_seq = ++seq_;
    std::memcpy(request, &header, sizeof header);
    if (device) {
      const nlattr attr{static_cast<std::uint16_t>(NLA_HDRLEN + sizeof(std::uint32_t)),
                        RDMA_NLDEV_ATTR_DEV_INDEX};
      std::memcpy(request + NLMSG_HDRLEN, &attr, sizeof attr);
      std::memcpy(request + NLMSG_HDRLEN + NLA_HDRLEN, &*device, sizeof(std::uint32_t));
    }
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    const ssize_t sent = ::sendto(fd_, request, header.nlmsg_len, 0,
                                  reinterpret_cast<const sockaddr*>(&kernel), sizeof kernel);
    if (sent != static_cast<ssize_t>(header.nlmsg_len))
      throw std::system_error(sent < 0 ? errno : EIO, std::generic_category(), "sendto: " + what);
  }

  std::size_t receive(const std::string& what) {
    for (;;) {
      iovec io{buffer_.data(), buffer_.size()};
      msghdr message{};
      message.msg_iov = &io;
      message.msg_iovlen = 1;
      const ssize_t n = ::recvmsg(fd_, &message, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::system_error(errno, std::generic_category(), "recvmsg: " + what);
      if (message.msg_flags & MSG_TRUNC)
        throw std::runtime_error(what + ": a reply did not fit in " + std::to_string(buffer_.size()) + " bytes");
      return static_cast<std::size_t>(n);
    }
  }

  int fd_;
  std::uint32_t seq_ = 0;
  std::vector<unsigned char> buffer_ = std::vector<unsigned char>(64 * 1024);  // > a dump part (32 KiB)
};

// The RDMA device indexes the kernel knows (RDMA_NLDEV_CMD_GET dump).
inline std::vector<std::uint32_t> rdma_device_indexes(NldevSocket& socket) {
  std::vector<std::uint32_t> indexes;
  socket.dump(RDMA_NLDEV_CMD_GET, "RDMA_NLDEV_CMD_GET", std::nullopt,
              [&](const unsigned char* attrs, std::size_t size) {
                return for_each_attr(attrs, size, [&](std::uint16_t type, const unsigned char* value, std::size_t len) {
                  if (type == RDMA_NLDEV_ATTR_DEV_INDEX && len >= sizeof(std::uint32_t)) {
                    std::uint32_t index;
                    std::memcpy(&index, value, sizeof index);
                    indexes.push_back(index);
                  }
                });
              });
  return indexes;
}

// Objects of each kind, on every device, whose owner is `pid` (RDMA_NLDEV_ATTR_RES_PID);
// kernel-owned objects carry no pid. pid 0 counts every object that has a pid. This is
// what `rdma resource show KIND` lists with "pid N". Only the kinds in `kinds` (bit i:
// rdma_kinds[i]) are read; the others stay 0.
// A dump part without an entry is an error: the kernel (nldev's res_get_common_dumpit, 6.1
// and later) sends one, and then the same again forever, when a single entry does not fit
// in a message. An SRQ's entry lists its QPs' numbers as ranges: one of thousands of QPs
// whose numbers interleave with other QPs' overflows (measured: 10,000, in the scale test).
inline std::array<long, rdma_kinds.size()> count_rdma_kinds(pid_t pid, std::uint32_t kinds = all_rdma_kinds) {
  NldevSocket socket;
  std::array<long, rdma_kinds.size()> counts{};
  for (const std::uint32_t device : rdma_device_indexes(socket)) {
    for (std::size_t i = 0; i < nldev_kinds.size(); ++i) {
      if ((kinds & (1u << i)) == 0) continue;
      const NldevKind& kind = nldev_kinds[i];
      auto on_entry = [&](std::uint16_t type, const unsigned char* value, std::size_t len) {
        if (type != kind.entry) return;
        std::optional<std::uint32_t> owner;
        for_each_attr(value, len, [&](std::uint16_t field, const unsigned char* data, std::size_t size) {
          if (field == RDMA_NLDEV_ATTR_RES_PID && size >= sizeof(std::uint32_t)) {
            std::uint32_t id;
            std::memcpy(&id, data, sizeof id);
            owner = id;
          }
        });
        if (owner && (pid == 0 || *owner == static_cast<std::uint32_t>(pid))) ++counts[i];
      };
      socket.dump(kind.command, kind.command_name, device, [&](const unsigned char* attrs, std::size_t size) {
        bool well_formed = true;
        long tables = 0, entries = 0;
        const bool top = for_each_attr(attrs, size, [&](std::uint16_t type, const unsigned char* value, std::size_t len) {
          if (type != kind.table) return;
          ++tables;
          well_formed = for_each_attr(value, len, [&](std::uint16_t entry, const unsigned char* v, std::size_t l) {
                          entries += entry == kind.entry;
                          on_entry(entry, v, l);
                        }) && well_formed;
        });
        if (top && well_formed && tables > 0 && entries == 0)
          throw std::runtime_error(std::string("RDMA netlink ") + kind.command_name + " dump of device index " +
                                   std::to_string(device) +
                                   ": a reply without an entry (the kernel cannot fit one entry in a message and "
                                   "would send the same reply forever; an SRQ with thousands of QPs does that)");
        return top && well_formed;
      });
    }
  }
  return counts;
}

// Objects of one kind of rdma_kinds ("cm_id", ...) owned by `pid` (0: by any process).
inline long count_rdma(std::string_view kind, pid_t pid) {
  for (std::size_t i = 0; i < rdma_kinds.size(); ++i)
    if (rdma_kinds[i] == kind) return count_rdma_kinds(pid, 1u << i)[i];
  throw std::invalid_argument("no RDMA ledger kind " + std::string(kind));
}

// `rdma resource show KIND`, one line per object. Slow (a process per call): for
// cross-checks only.
inline std::vector<std::string> rdma_tool_lines(std::string_view kind) {
  const std::string command = "rdma resource show " + std::string(kind) + " 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::system_error(errno, std::generic_category(), "popen " + command);
  std::vector<std::string> lines(1);
  for (int c; (c = std::fgetc(pipe)) != EOF;) {
    if (c == '\n') lines.emplace_back();
    else lines.back() += static_cast<char>(c);
  }
  lines.pop_back();  // what follows the last newline
  const int status = ::pclose(pipe);
  if (status != 0)
    throw std::runtime_error("`" + command + "` failed (status " + std::to_string(status) +
                             "): is iproute2's rdma tool installed?");
  return lines;
}

}  // namespace detail

// librdmacm opens a context (and its fds) on every RDMA device at its first use and keeps
// them until the process exits; a baseline taken before that would see them as a leak.
// Call this once before the first ledger_of() of a scenario.
inline void open_librdmacm_devices() {
  int n = 0;
  if (ibv_context** devices = ::rdma_get_devices(&n)) ::rdma_free_devices(devices);
}

// The ledger of `pid` (default: this process). Throws std::system_error naming the
// netlink command and errno when the kernel's resource tracker cannot be read.
// `kinds` as count_rdma_kinds's: without_srqs for a process holding an SRQ with thousands of
// QPs (the kernel cannot dump it).
inline Ledger ledger_of(pid_t pid = ::getpid(), std::uint32_t kinds = all_rdma_kinds) {
  Ledger ledger;
  ledger.rdma = detail::count_rdma_kinds(pid, kinds);  // its socket is closed before fds are counted
  ledger.fds = detail::count_fds(pid);
  return ledger;
}

// RDMA objects of every process on the machine (fds stay 0): after a process died, what
// it held must be gone from here.
inline Ledger ledger_of_all_processes() {
  Ledger ledger;
  ledger.rdma = detail::count_rdma_kinds(0);
  return ledger;
}

// The RDMA counts as `rdma resource show KIND` prints them: the lines with "pid PID" and
// the lines with any pid (kernel-owned objects print none). One tool run per kind (seconds
// under TCG): the reference ledger_test holds the netlink counts to. Throws when the tool
// cannot run.
struct RdmaToolCounts {
  std::array<long, rdma_kinds.size()> of_pid{};
  std::array<long, rdma_kinds.size()> of_all_processes{};
};
inline RdmaToolCounts rdma_tool_counts(pid_t pid) {
  RdmaToolCounts counts;
  const std::string want = " pid " + std::to_string(pid) + " ";
  for (std::size_t i = 0; i < rdma_kinds.size(); ++i) {
    for (std::string line : detail::rdma_tool_lines(rdma_kinds[i])) {
      line = " " + line + " ";
      if (line.find(want) != std::string::npos) ++counts.of_pid[i];
      if (line.find(" pid ") != std::string::npos) ++counts.of_all_processes[i];
    }
  }
  return counts;
}

// Polls (every 50 ms) until `read()` equals `baseline` or `timeout` passes: the kernel
// releases some objects asynchronously (a killed peer's QPs, TIME_WAIT cm_ids). Returns the
// last ledger read; equal to `baseline` on success.
template <class Read = Ledger (*)()>
Ledger wait_for_ledger(const Ledger& baseline, std::chrono::milliseconds timeout,
                       Read read = [] { return ledger_of(); }) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Ledger now = read();
  while (!(now == baseline) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    now = read();
  }
  return now;
}

}  // namespace reliability
