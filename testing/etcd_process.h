// Debian's etcd (etcd-server, /usr/bin/etcd) as a child process for tests
// of the pool (docs/pool.md): one member on loopback, data under a test's
// directory, on ports the kernel picked as free. Another process may take
// such a port between the pick and etcd's bind; etcd then exits and is
// started again on new ports (a few times).
//
//   absl::StatusOr<EtcdProcess> etcd = StartEtcd(dir);
//   ... "etcd://" + etcd->endpoint + "/prefix" ...
//   StopEtcd(*etcd);   // SIGTERM, reaped
//   RestartEtcd(*etcd) // the same ports and data
//
// With an EtcdTls, etcd serves its clients over TLS only (https), and asks
// for a client certificate when client_ca_file is set.
#ifndef OPSERVER_TESTING_ETCD_PROCESS_H_
#define OPSERVER_TESTING_ETCD_PROCESS_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/etcd_client.h"

namespace opserver::process {

// etcd's own TLS flags for its client URL.
struct EtcdTls {
  std::string cert_file;  // --cert-file, --key-file: set, https.
  std::string key_file;
  // Set: --client-cert-auth --trusted-ca-file, a client certificate signed
  // by this CA is required.
  std::string client_ca_file;
  // What the start-up probe presents: the CA of cert_file, and a client
  // certificate when client_ca_file is set.
  EtcdCredentials probe;
};

struct EtcdProcess {
  pid_t pid = 0;
  std::string endpoint;  // 127.0.0.1:PORT of the client URL.
  std::string dir;       // Its data and log live here.
  int client_port = 0;
  int peer_port = 0;
  EtcdTls tls;  // As started (kept for RestartEtcd).
};

// Starts etcd with its data in `dir`/etcd-data and its output in
// `dir`/etcd.log, and waits (up to a minute) until it serves clients
// (over TLS when `tls` names a certificate).
absl::StatusOr<EtcdProcess> StartEtcd(const std::string& dir,
                                      const EtcdTls& tls = {});
// SIGTERM and reap; pid becomes 0.
void StopEtcd(EtcdProcess& etcd);
// Starts it again on the same ports and data, after StopEtcd.
absl::Status RestartEtcd(EtcdProcess& etcd);

}  // namespace opserver::process

#endif  // OPSERVER_TESTING_ETCD_PROCESS_H_
