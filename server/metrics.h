// The server's Prometheus metrics (prometheus-cpp), served on
// --metrics_listen as /metrics in Prometheus' text format.
//
// Three kinds, by what they cost:
//  - per call, from a gRPC server interceptor: every RPC's start and its
//    latency by method and status, with gRFC A66's names and buckets
//    (grpc_server_call_started_total, grpc_server_call_duration_seconds);
//  - per event, where the event happens: launches by operator and dtype,
//    their queue wait and failures by aclnn status, plans refused, Pipeline
//    batches, commands and deferred errors. Each is a few atomic adds on
//    counters resolved once (a launch's counter is an array lookup);
//  - per scrape, from a snapshot the server takes only when /metrics is
//    read (Snapshot below): sessions, streams, executors and memory per
//    tenant, device capacity and reuse cache, queued launches, transfer
//    bytes over the data path and over gRPC, refused data-port
//    connections.
//
//   Metrics metrics;                        // owned by the Server
//   builder.experimental().SetInterceptorCreators(metrics.Interceptors());
//   metrics.SetSnapshot([&] { return ...; });
//   auto served = metrics.Serve("127.0.0.1:0");   // port: Serve's result
#ifndef OPSERVER_SERVER_METRICS_H_
#define OPSERVER_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/support/server_interceptor.h"
#include "kernels/dtype.h"
#include "kernels/op_kind.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "runtime/observer.h"

namespace opserver {

// What a scrape reports beyond the event counters, taken when /metrics is
// read.
struct MetricsSnapshot {
  // What one tenant's sessions on one device hold.
  struct Tenant {
    std::string name;    // The token's tenant; "anonymous" without tokens.
    std::string device;  // The device's index, e.g. "0".
    uint64_t sessions = 0;
    uint64_t streams = 0;  // Besides each session's default stream.
    uint64_t executors = 0;
    uint64_t buffers = 0;
    uint64_t buffer_bytes = 0;
    uint64_t events = 0;
    uint64_t pending_event_operations = 0;
    uint64_t attach_streams = 0;
    uint64_t pending_synchronizes = 0;
    uint64_t graphs = 0;
    uint64_t graph_tasks = 0;
  };
  std::vector<Tenant> tenants;
  // One per device the server owns, labelled by its index.
  struct Device {
    std::string device;  // The index, e.g. "0".
    uint64_t memory_capacity_bytes = 0;
    uint64_t memory_used_bytes = 0;
    uint64_t memory_cached_bytes = 0;
    uint64_t memory_free_bytes = 0;
    // Launches waiting on the streams of the device's sessions.
    uint64_t queued_launches = 0;
  };
  std::vector<Device> devices;
  uint64_t data_path_transfers = 0;
  uint64_t data_path_bytes = 0;
  uint64_t grpc_transfers = 0;
  uint64_t grpc_transfer_bytes = 0;
  uint64_t data_port_refused = 0;
  uint64_t data_port_accepted = 0;
  uint64_t data_port_reused = 0;
};

// How /metrics is served (civetweb's options). A connection that sends
// part of a request and then nothing holds one of `threads` until
// `request_timeout` ends it, so several threads and a short time-out keep a
// few silent connections from blocking every scrape (the third review,
// finding 6). Connections beyond the threads wait in a queue of
// `queued_connections`, and beyond that in the kernel's listen backlog.
struct MetricsServeOptions {
  int threads = 8;
  absl::Duration request_timeout = absl::Seconds(5);
  int queued_connections = 32;
};

class Metrics : public RuntimeObserver {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // For ServerBuilder::experimental().SetInterceptorCreators: one
  // interceptor per call, recording it.
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
  Interceptors();

  // Serves /metrics on HOST:PORT (port 0: any) until this object is gone;
  // the port it listens on. UNAVAILABLE when it cannot listen.
  absl::StatusOr<int> Serve(const std::string& host_port,
                            const MetricsServeOptions& options = {});

  // The scrape-time part (called on the exposer's thread for each scrape).
  void SetSnapshot(std::function<MetricsSnapshot()> snapshot);

  // RuntimeObserver: the runtime's events, counted. A launch's are a few
  // relaxed atomic adds.
  LaunchRecord LaunchQueued(kernels::OpKind op, kernels::DType dtype) override;
  void LaunchStarted(const LaunchRecord& record) override;
  void LaunchFinished(const LaunchRecord& record,
                      int32_t aclnn_status) override;
  void PlanRefused(kernels::OpKind op, int32_t aclnn_status) override;
  void PipelineBatch(size_t commands) override;
  void PipelineCommand(int command_case) override;
  void DeferredError() override;
  void GraphReplayed(uint64_t tasks) override;
  // --register's state (server/etcd_registration.h), after each attempt to
  // renew or redo the registration: opserver_registration_up is 1 while the
  // keys are in etcd as far as the last attempt knows, 0 while etcd is out
  // of reach; opserver_registration_failures_total counts the attempts that
  // failed. Neither appears on a server without --register.
  void RegistrationAttempt(bool succeeded);

  // The registry the event metrics live in (for tests).
  prometheus::Registry& registry() { return *registry_; }

 private:
  class Interceptor;
  class InterceptorFactory;
  class SnapshotCollector;

  prometheus::Counter& RpcStarted(const std::string& method);
  prometheus::Histogram& RpcDuration(const std::string& method,
                                     const std::string& status);

  const std::shared_ptr<prometheus::Registry> registry_;
  // RegistrationAttempt's, made at its first call.
  absl::once_flag registration_once_;
  prometheus::Gauge* registration_up_ = nullptr;
  prometheus::Counter* registration_failures_ = nullptr;
  const std::shared_ptr<SnapshotCollector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;

  // The families read at scrape time from the event counters below.
  void CollectEvents(std::vector<prometheus::MetricFamily>* families) const;

  prometheus::Family<prometheus::Counter>& rpc_started_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  // Rare events: prometheus-cpp's own counters.
  prometheus::Family<prometheus::Counter>& launch_failures_;
  prometheus::Family<prometheus::Counter>& plan_refusals_;

  // Per-launch and per-command events: plain relaxed atomics, each group on
  // its own cache line, turned into families only when scraped.
  // prometheus-cpp's counters add doubles in a compare-exchange loop and
  // its histogram takes a mutex; at half a million launches a second
  // (the pipelined rate) that cost showed (step_bench's A/B).
  static constexpr int kDTypeSlots = 32;
  static constexpr int kCommandSlots = 32;
  static constexpr int kWaitBuckets = 41;  // A66Buckets() (+Inf apart).
  struct alignas(64) LaunchCounts {
    std::array<std::atomic<uint64_t>, kDTypeSlots> by_dtype{};
  };
  std::unique_ptr<LaunchCounts[]> launches_;  // By OpKind.
  struct alignas(64) CommandCounts {
    std::array<std::atomic<uint64_t>, kCommandSlots> by_case{};
    std::atomic<uint64_t> batches{0};
    std::atomic<uint64_t> deferred_errors{0};
    std::atomic<uint64_t> graph_replays{0};
    std::atomic<uint64_t> graph_replayed_tasks{0};
  } commands_;
  struct alignas(64) WaitHistogram {
    std::array<std::atomic<uint64_t>, kWaitBuckets + 1> buckets{};  // +Inf.
    std::atomic<uint64_t> sum_ns{0};
  } queue_wait_;
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_METRICS_H_
