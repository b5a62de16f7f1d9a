#include "bench/soak_hostile.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/soak_reference.h"
#include "bench/soak_scenarios.h"

namespace opserver::soak {
namespace {

constexpr size_t kTicketBytes = 16;  // common/data_path.h

class HostileTenant {
 public:
  explicit HostileTenant(const HostileOptions& o)
      : o_(o),
        stats_(o.stats),
        rng_(o.seed),
        conn_(Connect(o.address, true, o.token)),
        wrong_(Connect(o.address, true, o.wrong_token)),
        none_(Connect(o.address, true, "")) {}

  void Run(absl::Time end, const std::atomic<bool>* stop) {
    while (absl::Now() < end && !stop->load()) {
      const uint64_t r = Rand(10);
      if (r < 3) {
        WrongToken(wrong_.get(), "wrong_token");
      } else if (r < 4) {
        NoToken();
      } else if (r < 8) {
        OtherTenantSession();
      } else {
        OwnWork();
      }
    }
  }

 private:
  uint64_t Rand(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  template <typename Req, typename Resp, typename Fn>
  Outcome Unary(const char* rpc, Fn fn, const Req& request, Resp* response,
                const Expect& e) {
    grpc::ClientContext context;
    SetDeadline(&context, kCallDeadline);
    const grpc::Status status = fn(&context, request, response);
    Outcome o = FromStatus(status, context);
    stats_->Record(rpc, e, o);
    return o;
  }

#define SOAK_RT(conn, method)                              \
  [conn](grpc::ClientContext* c, const auto& r, auto* p) { \
    return conn->rt->method(c, r, p);                      \
  }
#define SOAK_OPS(conn, method)                             \
  [conn](grpc::ClientContext* c, const auto& r, auto* p) { \
    return conn->ops->method(c, r, p);                     \
  }

  // Any RPC, on a channel whose token the server refuses.
  void WrongToken(Conn* conn, const char* category) {
    const Expect e = Invalid(category, Bit(StatusCode::UNAUTHENTICATED));
    std::string stolen = PickSessionName(o_.tenant, rng_);
    switch (Rand(6)) {
      case 0: {
        v1::CreateSessionRequest request;
        request.set_client_name("soak hostile tenant");
        v1::CreateSessionResponse response;
        Unary("CreateSession", SOAK_RT(conn, CreateSession), request, &response,
              e);
        break;
      }
      case 1: {
        v1::GetDeviceInfoResponse response;
        Unary("GetDeviceInfo", SOAK_RT(conn, GetDeviceInfo),
              v1::GetDeviceInfoRequest(), &response, e);
        break;
      }
      case 2: {
        v1::MallocRequest request;
        request.set_session(stolen);
        request.set_size(4096);
        v1::MallocResponse response;
        Unary("Malloc", SOAK_RT(conn, Malloc), request, &response, e);
        break;
      }
      case 3: {
        v1::ListOperatorsResponse response;
        Unary("ListOperators", SOAK_OPS(conn, ListOperators),
              v1::ListOperatorsRequest(), &response, e);
        break;
      }
      case 4: {
        v1::CloseSessionRequest request;
        request.set_session(stolen);
        v1::CloseSessionResponse response;
        Unary("CloseSession", SOAK_RT(conn, CloseSession), request, &response,
              e);
        break;
      }
      default: {
        grpc::ClientContext context;
        SetDeadline(&context, kCallDeadline);
        v1::AttachRequest request;
        request.set_session(stolen);
        auto reader = conn->rt->Attach(&context, request);
        v1::AttachEvent event;
        bool attached = false;
        while (reader->Read(&event)) attached = true;
        const grpc::Status status = reader->Finish();
        stats_->Record("Attach", e, FromStatus(status, context));
        if (attached) {
          stats_->Problem("hostile_attach",
                          "an Attach with a wrong token got an event");
        }
        break;
      }
    }
  }

  // No token at all: refused, except for grpc.health.v1, which needs none.
  void NoToken() {
    if (Rand(3) == 0) {
      grpc::health::v1::HealthCheckRequest request;
      grpc::health::v1::HealthCheckResponse response;
      grpc::ClientContext context;
      SetDeadline(&context, kCallDeadline);
      const grpc::Status status =
          none_->health->Check(&context, request, &response);
      if (stats_->Record("Health.Check", Valid(),
                         FromStatus(status, context)) &&
          status.ok() &&
          response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
        stats_->Problem("health", response.ShortDebugString());
      }
      return;
    }
    WrongToken(none_.get(), "no_token");
  }

  // This tenant's valid token with another tenant's session name: the
  // server answers exactly as for a session that does not exist, and the
  // session is unharmed (its owner's calls go on; a CloseSession here that
  // closed it would show up as their unexpected NOT_FOUNDs).
  void OtherTenantSession() {
    const std::string stolen = PickSessionName(o_.tenant, rng_);
    if (stolen.empty()) return;
    const Expect e =
        Invalid("other_tenant_session", Bit(StatusCode::NOT_FOUND));
    Conn* conn = conn_.get();
    switch (Rand(8)) {
      case 0: {
        v1::MallocRequest request;
        request.set_session(stolen);
        request.set_size(1 << 20);
        v1::MallocResponse response;
        Unary("Malloc", SOAK_RT(conn, Malloc), request, &response, e);
        break;
      }
      case 1: {
        v1::GetSessionStatsRequest request;
        request.set_session(stolen);
        v1::SessionStats response;
        Unary("GetSessionStats", SOAK_RT(conn, GetSessionStats), request,
              &response, e);
        break;
      }
      case 2: {
        v1::CloseSessionRequest request;
        request.set_session(stolen);
        v1::CloseSessionResponse response;
        Unary("CloseSession", SOAK_RT(conn, CloseSession), request, &response,
              e);
        break;
      }
      case 3: {
        v1::FreeRequest request;
        request.set_session(stolen);
        request.set_buffer(1 + Rand(8));
        v1::FreeResponse response;
        Unary("Free", SOAK_RT(conn, Free), request, &response, e);
        break;
      }
      case 4: {
        v1::ReadValuesRequest request;
        request.set_session(stolen);
        request.set_buffer(1 + Rand(8));
        request.set_dtype(v1::UINT8);
        request.set_count(16);
        v1::ReadValuesResponse response;
        Unary("ReadValues", SOAK_RT(conn, ReadValues), request, &response, e);
        break;
      }
      case 5: {
        v1::CreateStreamRequest request;
        request.set_session(stolen);
        v1::CreateStreamResponse response;
        Unary("CreateStream", SOAK_RT(conn, CreateStream), request, &response,
              e);
        break;
      }
      case 6:
        StolenDownload(conn, stolen, e);
        break;
      default:
        StolenAttach(conn, stolen, e);
        break;
    }
  }

  // A Download of a buffer of the session `stolen`: no data may come.
  void StolenDownload(Conn* conn, const std::string& stolen, const Expect& e) {
    grpc::ClientContext context;
    SetDeadline(&context, kCallDeadline);
    v1::DownloadRequest request;
    request.set_session(stolen);
    request.set_buffer(1 + Rand(8));
    request.set_size(16);
    auto reader = conn->rt->Download(&context, request);
    v1::DownloadResponse chunk;
    bool data = false;
    while (reader->Read(&chunk)) data = true;
    stats_->Record("Download", e, FromStatus(reader->Finish(), context));
    if (data) {
      stats_->Problem("other_tenant_session",
                      "a Download of another tenant's buffer got data");
    }
  }

  // An Attach to the session `stolen`: it may not attach.
  void StolenAttach(Conn* conn, const std::string& stolen, const Expect& e) {
    grpc::ClientContext context;
    SetDeadline(&context, kCallDeadline);
    v1::AttachRequest request;
    request.set_session(stolen);
    auto reader = conn->rt->Attach(&context, request);
    v1::AttachEvent event;
    bool attached = false;
    while (reader->Read(&event)) attached = true;
    stats_->Record("Attach", e, FromStatus(reader->Finish(), context));
    if (attached) {
      stats_->Problem("other_tenant_session",
                      "another tenant's session was attached");
    }
  }

  // What the tenant may do: a session of its own, used and closed.
  void OwnWork() {
    Conn* conn = conn_.get();
    v1::CreateSessionRequest create;
    create.set_client_name(absl::StrCat("soak hostile tenant ", o_.id));
    v1::CreateSessionResponse session;
    if (!Unary("CreateSession", SOAK_RT(conn, CreateSession), create, &session,
               Valid())
             .ok()) {
      return;
    }
    PublishSessionName(o_.tenant, session.session());
    v1::MallocRequest malloc_request;
    malloc_request.set_session(session.session());
    malloc_request.set_size(4096);
    v1::MallocResponse buffer;
    if (Unary("Malloc", SOAK_RT(conn, Malloc), malloc_request, &buffer, Valid())
            .ok()) {
      v1::WriteValuesRequest write;
      write.set_session(session.session());
      write.set_buffer(buffer.buffer());
      write.set_dtype(v1::FLOAT);
      for (int i = 0; i < 3; ++i) write.add_values(i + 0.5);
      v1::WriteValuesResponse written;
      v1::ReadValuesRequest read;
      read.set_session(session.session());
      read.set_buffer(buffer.buffer());
      read.set_dtype(v1::FLOAT);
      read.set_count(3);
      v1::ReadValuesResponse values;
      if (Unary("WriteValues", SOAK_RT(conn, WriteValues), write, &written,
                Valid())
              .ok() &&
          Unary("ReadValues", SOAK_RT(conn, ReadValues), read, &values, Valid())
              .ok() &&
          (values.values_size() != 3 || values.values(2) != 2.5)) {
        stats_->Problem("hostile_own_values", values.ShortDebugString());
      }
    }
    v1::CloseSessionRequest close;
    close.set_session(session.session());
    v1::CloseSessionResponse closed;
    Unary("CloseSession", SOAK_RT(conn, CloseSession), close, &closed, Valid());
  }

#undef SOAK_RT
#undef SOAK_OPS

  const HostileOptions o_;
  Stats* const stats_;
  std::mt19937_64 rng_;
  std::shared_ptr<Conn> conn_, wrong_, none_;
};

// A TCP connection to host:port within 2 s, or -1 (a blocking connect to
// a listener whose queue is full could wait for minutes).
int Dial(const std::string& host, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    close(fd);
    return -1;
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t len = sizeof(error);
    if (errno != EINPROGRESS || poll(&p, 1, 2000) != 1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
      close(fd);
      return -1;
    }
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// Whether the peer closed `fd` (or reset it) within `timeout`.
bool ClosedWithin(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(ms)) > 0) {
      char buf[64];
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0) return true;  // EOF or reset.
      // The server never sends bytes for a connection without a ticket.
      return false;
    }
  }
}

// The server's data port, from GetServerStats (recorded); 0, recorded as a
// problem when the server has none, when it cannot be read.
int DataPort(const HostileOptions& o) {
  auto conn = Connect(o.address, true, o.token);
  grpc::ClientContext context;
  SetDeadline(&context, kCallDeadline);
  v1::ServerStats server;
  const grpc::Status status =
      conn->rt->GetServerStats(&context, v1::GetServerStatsRequest(), &server);
  if (!o.stats->Record("GetServerStats", Valid(), FromStatus(status, context)))
    return 0;
  if (server.data_port() == 0) {
    o.stats->Problem("data_port_flood", "the server reports no data port");
  }
  return static_cast<int>(server.data_port());
}

// One flood connection: a whole ticket nobody was given (into `garbage`),
// a few bytes then nothing, or nothing at all (into `idle`).
void FloodConnection(const std::string& host, int port, std::mt19937_64& rng,
                     std::vector<int>* garbage, std::vector<int>* idle) {
  const int fd = Dial(host, port);
  if (fd < 0) {
    // The listener's backlog may be full for a moment; not an error of
    // the server's, but it must take connections again afterwards.
    return;
  }
  switch (rng() % 3) {
    case 0: {  // A whole ticket nobody was given.
      char ticket[kTicketBytes];
      for (char& c : ticket) c = static_cast<char>(rng());
      if (write(fd, ticket, sizeof(ticket)) == sizeof(ticket)) {
        garbage->push_back(fd);
      } else {
        close(fd);
      }
      break;
    }
    case 1: {  // A few bytes, then nothing.
      char part[3];
      for (char& c : part) c = static_cast<char>(rng());
      if (write(fd, part, sizeof(part)) < 0) {
        close(fd);
        break;
      }
      idle->push_back(fd);
      break;
    }
    default:  // Nothing at all.
      idle->push_back(fd);
      break;
  }
}

}  // namespace

void RunHostileTenant(const HostileOptions& options, absl::Time end,
                      const std::atomic<bool>* stop) {
  HostileTenant tenant(options);
  tenant.Run(end, stop);
}

void RunDataPortFlood(const HostileOptions& o, absl::Time end,
                      const std::atomic<bool>* stop) {
  Stats* stats = o.stats;
  std::mt19937_64 rng(o.seed);
  const int port = DataPort(o);
  if (port == 0) return;
  const std::string host =
      std::vector<std::string>(absl::StrSplit(o.address, ':'))[0];
  while (absl::Now() < end && !stop->load()) {
    const int n = 8 + static_cast<int>(rng() % 24);
    std::vector<int> garbage, idle;
    for (int i = 0; i < n; ++i)
      FloodConnection(host, port, rng, &garbage, &idle);
    // A ticket nobody was given is closed at once (its first bytes are no
    // expected ticket's prefix); 5 s is slack for a loaded machine.
    for (int fd : garbage) {
      if (ClosedWithin(fd, absl::Seconds(5))) {
        stats->Record("DataPort wrong ticket",
                      Invalid("data_port_flood", Bit(StatusCode::OK)),
                      Outcome());
      } else {
        stats->Problem("data_port_flood",
                       "a connection that sent a wrong ticket is still open "
                       "5 s later");
      }
      close(fd);
    }
    absl::SleepFor(absl::Milliseconds(50 + rng() % 300));
    for (int fd : idle) close(fd);
    // The port still answers a connection afterwards.
    const int fd = Dial(host, port);
    stats->Record("DataPort connect", Valid(),
                  fd >= 0 ? Outcome()
                          : Outcome{StatusCode::UNAVAILABLE, 0,
                                    "cannot connect to the data port"});
    if (fd >= 0) close(fd);
    absl::SleepFor(absl::Milliseconds(rng() % 200));
  }
}

}  // namespace opserver::soak
