// ConnectOptions: how a Client reaches its server (deadlines, TLS, the
// token, the data path and the pipelined command channel). Part of the
// client library; include client/client.h.
#ifndef OPSERVER_CLIENT_CONNECT_OPTIONS_H_
#define OPSERVER_CLIENT_CONNECT_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "client/command_channel.h"

namespace opserver {
namespace remote {

// The most connections one transfer is split over (each is a TCP
// connection and, during a transfer, a thread).
inline constexpr int kMaxTransferConnections = 16;

// How a Client reaches its server.
struct ConnectOptions {
  // Deadline for establishing the connection in Connect().
  absl::Duration connect_timeout = absl::Seconds(5);
  // Deadline applied to each call that does not wait for device work.
  absl::Duration call_timeout = absl::Seconds(30);
  // Deadline of calls that wait for device work or move data: each whole
  // Upload/Download, SynchronizeStream and DestroyStream.
  absl::Duration wait_timeout = absl::Minutes(10);
  // Bytes per Upload message.
  uint64_t upload_chunk_bytes = 1 << 20;
  // Upload and Download calls go over connections of their own, never
  // the one that carries the session's other calls, and uploads never
  // share a connection with downloads: an HTTP/2 proxy that stalls a whole
  // connection while one stream's data cannot move on (HAProxy 2.6 does)
  // would otherwise deadlock when one session uploads while another
  // downloads: each direction's window update waits behind the other
  // direction's data (docs/pool.md, "Transfers through a proxy").
  // An Upload or Download of at least transfer_split_bytes of a buffer of
  // a pipelined session goes over this many TCP connections at once, in
  // parts, the extra ones on short-lived streams of their own: one
  // connection leaves the receiving side idle between messages
  // (BENCHMARKS.md, "Several connections"). Each direction's connections
  // are opened on its first transfer; where connections or streams cannot
  // be had, the transfer is one call. 1: always one call.
  // From 1 to kMaxTransferConnections.
  int transfer_connections = 4;
  uint64_t transfer_split_bytes = 32ull << 20;
  // A transfer call (an Upload or Download, or one part of a split one)
  // that moves no message for this long is cancelled and fails with
  // DEADLINE_EXCEEDED saying so, rather than waiting out wait_timeout: a
  // stalled proxy or server never answers, and the server's own idle
  // timeout cannot reach the client through it. Watched: each part of a
  // split transfer, and a download from its first message on (before, the
  // server may be waiting for the work queued on its stream, however long
  // that takes). The server's default --transfer_idle_timeout_s.
  // absl::InfiniteDuration(): never.
  absl::Duration transfer_idle_timeout = absl::Seconds(60);
  // An Upload or Download of at least data_path_bytes goes over the
  // server's data path when it has one (common/data_path.h: a plain TCP
  // connection beside the channel that carries the raw bytes, so neither side
  // copies them through gRPC's buffers; BENCHMARKS.md, "The data path").
  // Never with TLS (the data path is not encrypted). Where the server has
  // none or its port cannot be reached, the client says so once on stderr
  // and uses Upload/Download (split as above) from then on.
  bool data_path = true;
  uint64_t data_path_bytes = 4ull << 20;
  // A data-path connection stays open for the next transfer when the
  // server agrees (at most 4 idle per Client): no connect per transfer,
  // and TCP's window stays as large as it grew (a fresh connection starts
  // small, which costs the receiver of a few MiB up to twice the CPU per
  // byte). Off: one connection per transfer.
  bool keep_data_connections = true;
  // On a pipelined session with a data connection kept, UploadAsync and
  // DownloadAsync send their transfer as a data_transfer command on the
  // channel, with a ticket of their own, instead of an OpenDataTransfer
  // call: no call per transfer and no wait for the server's ticket (through
  // the Ascend chain, each 4 MiB staging copy is one such transfer).
  // Their result then says how the bytes moved; what the server met after
  // that (a device copy failing) is the stream's deferred error. Off: every
  // transfer opens a call.
  bool pipelined_data_transfers = true;
  // Largest message accepted from the server (the
  // client accepted any size, so a hostile server could make it allocate
  // without bound). A server sends at most its --max_message_bytes (64 MiB
  // by default); raise this for one configured higher. At most 2 GiB - 1.
  uint64_t max_message_bytes = 64ull << 20;

  // TLS is used when any of the three files is set. PEM files: the CA that
  // signed the server's certificate (empty = the system's roots) and, for a
  // server that requires client certificates (mTLS), this client's
  // certificate chain and private key.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // The name the server's certificate must carry, when it is not the host
  // in the address (e.g. dialing an IP address that is not in the SAN).
  std::string tls_server_name;
  // Sent as "authorization: Bearer TOKEN" with every call when set (a server
  // with --auth_token_file requires it).
  std::string token;

  // Pipelined execution (the default): each session opens an ordered
  // command channel (Operators.Pipeline). Phase one of an operator is
  // checked and sized here with the server's own validation code and
  // returns without a round trip; launches, frees and executor calls are
  // queued on the channel and return at once; errors only the server can
  // find are deferred to the next Synchronize of the stream (or, for
  // commands without a stream, the next Download/ReadValues/Close). Every
  // other call first waits until the channel's commands took effect, so
  // calls take effect in the order they were made. Off: every call is its
  // own unary RPC (for debugging). A server without the channel gets unary
  // calls either way.
  bool pipeline = true;
  ChannelWindow pipeline_window;
};

}  // namespace remote
}  // namespace opserver

#endif  // OPSERVER_CLIENT_CONNECT_OPTIONS_H_
