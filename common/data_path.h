// The data path: a plain TCP connection beside the gRPC channel that carries
// the bytes of one large transfer, so neither side copies them through
// gRPC's buffers (BENCHMARKS.md, "The data path"). A transfer is opened by
// the Runtime.OpenDataTransfer call, which checks everything and answers
// with a one-time ticket and a port; the client connects to that port on
// the server's host, sends the ticket, and then the raw bytes flow: the
// upload's bytes from the client, then the client's half-close; or the
// download's bytes from the server. The call's status is the transfer's.
// A client may keep the connection for its next transfer (the request's
// keep_connection): the transfer then ends after its last byte, not with a
// half-close, and the next ticket follows on the same connection.
//
// What both ends share: the ticket's size and socket helpers.
#ifndef OPSERVER_COMMON_DATA_PATH_H_
#define OPSERVER_COMMON_DATA_PATH_H_

#include <netdb.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace opserver {

// Bytes of a data-path ticket (random; 128 bits cannot be guessed).
inline constexpr size_t kDataTicketBytes = 16;

// On a connection the client keeps for its next transfer
// (OpenDataTransferRequest.keep_connection), the byte the server sends
// once the last byte of an upload is in device memory: the end of an
// upload that has no half-close, and its success.
inline constexpr char kDataUploadAck = 'K';

// An owned file descriptor, closed on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Writes all of data[0, size) to the socket `fd` (blocking), without
// SIGPIPE. UNAVAILABLE naming the OS's reason when the peer went away.
// `moved`, if set, is called after each send that moved bytes (so a slow
// peer that keeps moving can be told from a stalled one; keep it cheap).
absl::Status SendAll(int fd, const char* data, size_t size,
                     const std::function<void()>& moved = nullptr);

// Reads into data[0, size) until it is full or the peer half-closed
// (blocking; woken by the half megabyte, or the rest, not by every segment,
// and at least once a second when bytes came). Returns the bytes read:
// fewer than `size` only at the end of the stream. UNAVAILABLE naming the
// OS's reason on a socket error, or "Resource temporarily unavailable"
// once nothing came for the socket's SO_RCVTIMEO. `moved`, if set, is
// called after each receive that moved bytes.
absl::StatusOr<size_t> RecvFull(int fd, char* data, size_t size,
                                const std::function<void()>& moved = nullptr);

// Connects to HOST:PORT (each address the host resolves to in turn, each
// for at most `timeout`) and returns the blocking socket, with
// send and receive timeouts of `io_timeout` (0: none). UNAVAILABLE naming
// the address and the reason when no address answers.
absl::StatusOr<UniqueFd> ConnectTcp(const std::string& host, int port,
                                    absl::Duration timeout,
                                    absl::Duration io_timeout);

// Tries a new non-blocking TCP socket for each address `host` resolves to
// (`passive`: addresses to listen on) with `port`, in order, until
// `use(fd, address)` returns true, and returns that socket. `use` leaves
// errno set when it returns false. Otherwise UNAVAILABLE:
// "data path: cannot WHAT HOST port PORT: <the last failure's reason>".
absl::StatusOr<UniqueFd> FirstUsableSocket(
    const std::string& host, int port, bool passive, absl::string_view what,
    const std::function<bool(int fd, const addrinfo& address)>& use);

// `bytes` random bytes from the kernel's CSPRNG (getrandom).
absl::StatusOr<std::string> RandomBytes(size_t bytes);

}  // namespace opserver

#endif  // OPSERVER_COMMON_DATA_PATH_H_
