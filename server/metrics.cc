#include "server/metrics.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/status_code_enum.h"
#include "kernels/validate.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "proto/opserver.pb.h"

namespace opserver {
namespace {

// gRFC A66's latency buckets, in seconds.
const prometheus::Histogram::BucketBoundaries& A66Buckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0,     0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002,
      0.003, 0.004,   0.005,   0.006,  0.008,  0.01,   0.013,  0.016, 0.02,
      0.025, 0.03,    0.04,    0.05,   0.065,  0.08,   0.1,    0.13,  0.16,
      0.2,   0.25,    0.3,     0.4,    0.5,    0.65,   0.8,    1,     2,
      5,     10,      20,      50,     100};
  return *buckets;
}

// The gRPC status code's name, as A66's grpc.status label carries it
// ("OK", "INVALID_ARGUMENT", ...: gRPC's codes are Abseil's).
std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// A66's grpc.method: the full method name for a method of a service this
// server knows ("opserver.v1.Runtime/Malloc"), else "other", so a client
// calling made-up names cannot grow the label set.
std::string MethodLabel(const char* path) {
  absl::string_view name(path == nullptr ? "" : path);
  if (absl::ConsumePrefix(&name, "/")) {
    const std::string dotted = absl::StrReplaceAll(name, {{"/", "."}});
    if (google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(
            dotted) != nullptr ||
        absl::StartsWith(name, "grpc.health.v1.Health/") ||
        absl::StartsWith(name, "grpc.reflection.v1alpha.ServerReflection/")) {
      return std::string(name);
    }
  }
  return "other";
}

std::string OpName(kernels::OpKind op) {
  return std::string(kernels::GetOpInfo(op).name);
}

// A new family at the end of `families`.
prometheus::MetricFamily& AddFamily(
    std::vector<prometheus::MetricFamily>& families, const char* name,
    const char* help, prometheus::MetricType type) {
  families.push_back(prometheus::MetricFamily{name, help, type, {}});
  return families.back();
}

// One sample of family `f` (a counter or a gauge, as the family is).
void AddSample(prometheus::MetricFamily& f,
               std::vector<prometheus::ClientMetric::Label> labels,
               double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (f.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
}

// What each owner's sessions hold, per device and tenant.
void AddTenantFamilies(const MetricsSnapshot& s,
                       std::vector<prometheus::MetricFamily>& families) {
  const struct {
    const char* name;
    const char* help;
    uint64_t MetricsSnapshot::Tenant::*field;
  } per_tenant[] = {
      {"opserver_sessions", "Open sessions, per tenant.",
       &MetricsSnapshot::Tenant::sessions},
      {"opserver_streams",
       "Streams besides each session's default stream, per tenant.",
       &MetricsSnapshot::Tenant::streams},
      {"opserver_executors", "Executors (planned operators), per tenant.",
       &MetricsSnapshot::Tenant::executors},
      {"opserver_buffers", "Device buffers, per tenant.",
       &MetricsSnapshot::Tenant::buffers},
      {"opserver_buffer_bytes", "Bytes of device buffers, per tenant.",
       &MetricsSnapshot::Tenant::buffer_bytes},
      {"opserver_events", "Events not destroyed, per tenant.",
       &MetricsSnapshot::Tenant::events},
      {"opserver_pending_event_operations",
       "Event records, waits, resets and synchronizes outstanding, per "
       "tenant.",
       &MetricsSnapshot::Tenant::pending_event_operations},
      {"opserver_attach_streams", "Open Attach calls, per tenant.",
       &MetricsSnapshot::Tenant::attach_streams},
      {"opserver_pending_synchronizes",
       "SynchronizeStream and SynchronizeEvent calls not yet answered, per "
       "tenant.",
       &MetricsSnapshot::Tenant::pending_synchronizes},
      {"opserver_graphs", "Graphs defined and not destroyed, per tenant.",
       &MetricsSnapshot::Tenant::graphs},
      {"opserver_graph_tasks", "Tasks of those graphs, per tenant.",
       &MetricsSnapshot::Tenant::graph_tasks},
  };
  for (const auto& m : per_tenant) {
    prometheus::MetricFamily& f =
        AddFamily(families, m.name, m.help, prometheus::MetricType::Gauge);
    for (const MetricsSnapshot::Tenant& t : s.tenants) {
      AddSample(f, {{"device", t.device}, {"tenant", t.name}},
                static_cast<double>(t.*(m.field)));
    }
  }
}

// Each device's memory and queued launches.
void AddDeviceFamilies(const MetricsSnapshot& s,
                       std::vector<prometheus::MetricFamily>& families) {
  const struct {
    const char* name;
    const char* help;
    uint64_t MetricsSnapshot::Device::*field;
  } per_device[] = {
      {"opserver_device_memory_capacity_bytes",
       "The device's memory capacity (its share of --device_memory_bytes).",
       &MetricsSnapshot::Device::memory_capacity_bytes},
      {"opserver_device_memory_used_bytes", "Device memory held by buffers.",
       &MetricsSnapshot::Device::memory_used_bytes},
      {"opserver_device_memory_cached_bytes",
       "Freed device memory kept for reuse.",
       &MetricsSnapshot::Device::memory_cached_bytes},
      {"opserver_device_memory_free_bytes",
       "Device memory a Malloc could still get (the cache gives way).",
       &MetricsSnapshot::Device::memory_free_bytes},
      {"opserver_stream_queued_launches",
       "Launches waiting on the streams of the device's sessions.",
       &MetricsSnapshot::Device::queued_launches},
  };
  for (const auto& m : per_device) {
    prometheus::MetricFamily& f =
        AddFamily(families, m.name, m.help, prometheus::MetricType::Gauge);
    for (const MetricsSnapshot::Device& d : s.devices) {
      AddSample(f, {{"device", d.device}}, static_cast<double>(d.*(m.field)));
    }
  }
}

// Completed transfers and their bytes, by path, and the data port's
// refusals.
void AddTransferFamilies(const MetricsSnapshot& s,
                         std::vector<prometheus::MetricFamily>& families) {
  using prometheus::MetricType;
  prometheus::MetricFamily& transfers =
      AddFamily(families, "opserver_transfers_total",
                "Completed transfer calls, by path (data_path: the raw TCP "
                "data port; grpc: Upload/Download).",
                MetricType::Counter);
  AddSample(transfers, {{"path", "data_path"}},
            static_cast<double>(s.data_path_transfers));
  AddSample(transfers, {{"path", "grpc"}},
            static_cast<double>(s.grpc_transfers));
  prometheus::MetricFamily& bytes =
      AddFamily(families, "opserver_transfer_bytes_total",
                "Bytes moved by completed transfer calls, by path.",
                MetricType::Counter);
  AddSample(bytes, {{"path", "data_path"}},
            static_cast<double>(s.data_path_bytes));
  AddSample(bytes, {{"path", "grpc"}},
            static_cast<double>(s.grpc_transfer_bytes));
  AddSample(
      AddFamily(families, "opserver_data_port_refused_connections_total",
                "Connections to the data port closed without a transfer (no "
                "room, too many from one source, no valid ticket in time).",
                MetricType::Counter),
      {}, static_cast<double>(s.data_port_refused));
  AddSample(
      AddFamily(families, "opserver_data_port_connections_total",
                "Connections the data port accepted.", MetricType::Counter),
      {}, static_cast<double>(s.data_port_accepted));
  AddSample(
      AddFamily(families, "opserver_data_port_reused_connections_total",
                "Transfers whose ticket came on a connection an earlier "
                "transfer kept (OpenDataTransferRequest.keep_connection).",
                MetricType::Counter),
      {}, static_cast<double>(s.data_port_reused));
}

}  // namespace

// One per call: started when gRPC creates it, recorded when the status is
// sent.
class Metrics::Interceptor final : public grpc::experimental::Interceptor {
 public:
  Interceptor(Metrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)), start_(absl::Now()) {
    metrics_->RpcStarted(method_).Increment();
  }

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_
          ->RpcDuration(method_,
                        CodeName(methods->GetSendStatus().error_code()))
          .Observe(absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  Metrics* const metrics_;
  const std::string method_;
  const absl::Time start_;
};

class Metrics::InterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit InterceptorFactory(Metrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new Interceptor(metrics_, MethodLabel(info->method()));
  }

 private:
  Metrics* const metrics_;
};

// The scrape-time families, from the snapshot function.
class Metrics::SnapshotCollector final : public prometheus::Collectable {
 public:
  explicit SnapshotCollector(const Metrics* metrics) : metrics_(metrics) {}

  void Set(std::function<MetricsSnapshot()> snapshot) {
    absl::MutexLock lock(&mu_);
    snapshot_ = std::move(snapshot);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families;
    metrics_->CollectEvents(&families);
    // Under the lock: once Set(nullptr) returns, no snapshot is running,
    // so what it reads may go.
    absl::MutexLock lock(&mu_);
    if (!snapshot_) return families;
    const MetricsSnapshot s = snapshot_();
    AddTenantFamilies(s, families);
    AddDeviceFamilies(s, families);
    AddTransferFamilies(s, families);
    return families;
  }

 private:
  const Metrics* const metrics_;
  mutable absl::Mutex mu_;
  std::function<MetricsSnapshot()> snapshot_ ABSL_GUARDED_BY(mu_);
};

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      collector_(std::make_shared<SnapshotCollector>(this)),
      rpc_started_(prometheus::BuildCounter()
                       .Name("grpc_server_call_started_total")
                       .Help("Calls started, by method (gRFC A66).")
                       .Register(*registry_)),
      rpc_duration_(
          prometheus::BuildHistogram()
              .Name("grpc_server_call_duration_seconds")
              .Help("Calls finished: from start to the status sent, by "
                    "method and status code (gRFC A66).")
              .Register(*registry_)),
      launch_failures_(
          prometheus::BuildCounter()
              .Name("opserver_launch_failures_total")
              .Help("Launches that ran and failed, by operator and aclnn "
                    "status.")
              .Register(*registry_)),
      plan_refusals_(prometheus::BuildCounter()
                         .Name("opserver_plan_refusals_total")
                         .Help("GetWorkspaceSize calls refused, by operator "
                               "and aclnn status.")
                         .Register(*registry_)),
      launches_(new LaunchCounts[kernels::OpRegistry().size()]) {}

Metrics::~Metrics() = default;

void Metrics::RegistrationAttempt(bool succeeded) {
  absl::call_once(registration_once_, [this] {
    registration_up_ =
        &prometheus::BuildGauge()
             .Name("opserver_registration_up")
             .Help(
                 "1 while this server's keys are in etcd (--register) as "
                 "far as the last renewal knows, 0 while etcd is out of "
                 "reach (the server serves on and retries).")
             .Register(*registry_)
             .Add({});
    registration_failures_ =
        &prometheus::BuildCounter()
             .Name("opserver_registration_failures_total")
             .Help(
                 "Renewals and re-registrations in etcd (--register) that "
                 "failed.")
             .Register(*registry_)
             .Add({});
  });
  registration_up_->Set(succeeded ? 1 : 0);
  if (!succeeded) registration_failures_->Increment();
}

std::vector<
    std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
Metrics::Interceptors() {
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      factories;
  factories.push_back(std::make_unique<InterceptorFactory>(this));
  return factories;
}

absl::StatusOr<int> Metrics::Serve(const std::string& host_port,
                                   const MetricsServeOptions& options) {
  const int64_t timeout_ms =
      std::max<int64_t>(1, absl::ToInt64Milliseconds(options.request_timeout));
  std::vector<std::string> civetweb_options = {
      "listening_ports",
      host_port,
      "num_threads",
      absl::StrCat(std::max(1, options.threads)),
      "request_timeout_ms",
      absl::StrCat(timeout_ms),
      // A scrape is one request: a kept-alive connection would hold a
      // thread between scrapes.
      "enable_keep_alive",
      "no",
      "connection_queue",
      absl::StrCat(std::max(1, options.queued_connections)),
  };
  try {
    exposer_ =
        std::make_unique<prometheus::Exposer>(std::move(civetweb_options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", host_port, ": ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(collector_);
  const std::vector<int> ports = exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", host_port));
  }
  return ports.front();
}

void Metrics::SetSnapshot(std::function<MetricsSnapshot()> snapshot) {
  collector_->Set(std::move(snapshot));
}

prometheus::Counter& Metrics::RpcStarted(const std::string& method) {
  return rpc_started_.Add({{"grpc_method", method}});
}

prometheus::Histogram& Metrics::RpcDuration(const std::string& method,
                                            const std::string& status) {
  return rpc_duration_.Add({{"grpc_method", method}, {"grpc_status", status}},
                           A66Buckets());
}

RuntimeObserver::LaunchRecord Metrics::LaunchQueued(kernels::OpKind op,
                                                    kernels::DType dtype) {
  const size_t index = static_cast<size_t>(op);
  const int slot = static_cast<int>(dtype);
  if (index < kernels::OpRegistry().size() && slot >= 0 && slot < kDTypeSlots) {
    launches_[index].by_dtype[slot].fetch_add(1, std::memory_order_relaxed);
  }
  return LaunchRecord{this, op, absl::Now()};
}

void Metrics::LaunchStarted(const LaunchRecord& record) {
  const absl::Duration waited = absl::Now() - record.queued;
  const double seconds = absl::ToDoubleSeconds(waited);
  const auto& bounds = A66Buckets();
  // The first bucket whose upper bound holds the wait (le is inclusive).
  const size_t bucket =
      std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin();
  WaitHistogram& h = queue_wait_;
  h.buckets[std::min<size_t>(bucket, kWaitBuckets)].fetch_add(
      1, std::memory_order_relaxed);
  h.sum_ns.fetch_add(static_cast<uint64_t>(std::max<int64_t>(
                         0, absl::ToInt64Nanoseconds(waited))),
                     std::memory_order_relaxed);
}

void Metrics::LaunchFinished(const LaunchRecord& record, int32_t aclnn_status) {
  if (aclnn_status == 0) return;
  launch_failures_
      .Add({{"op", OpName(record.op)},
            {"aclnn_status", absl::StrCat(aclnn_status)}})
      .Increment();
}

void Metrics::PlanRefused(kernels::OpKind op, int32_t aclnn_status) {
  plan_refusals_
      .Add({{"op", OpName(op)}, {"aclnn_status", absl::StrCat(aclnn_status)}})
      .Increment();
}

void Metrics::PipelineBatch(size_t /*commands*/) {
  commands_.batches.fetch_add(1, std::memory_order_relaxed);
}

void Metrics::PipelineCommand(int command_case) {
  if (command_case > 0 && command_case < kCommandSlots) {
    commands_.by_case[command_case].fetch_add(1, std::memory_order_relaxed);
  }
}

void Metrics::DeferredError() {
  commands_.deferred_errors.fetch_add(1, std::memory_order_relaxed);
}

void Metrics::GraphReplayed(uint64_t tasks) {
  commands_.graph_replays.fetch_add(1, std::memory_order_relaxed);
  commands_.graph_replayed_tasks.fetch_add(tasks, std::memory_order_relaxed);
}

void Metrics::CollectEvents(
    std::vector<prometheus::MetricFamily>* families) const {
  using prometheus::MetricType;
  auto counter = [](std::vector<prometheus::ClientMetric::Label> labels,
                    uint64_t value) {
    prometheus::ClientMetric m;
    m.label = std::move(labels);
    m.counter.value = static_cast<double>(value);
    return m;
  };
  prometheus::MetricFamily launches{
      "opserver_launches_total",
      "Launches queued, by operator and gradOutput dtype.",
      MetricType::Counter,
      {}};
  const std::vector<kernels::OpInfo>& ops = kernels::OpRegistry();
  for (size_t i = 0; i < ops.size(); ++i) {
    for (const kernels::TensorArgInfo& t : ops[i].tensors) {
      if (t.name != "gradOutput") continue;
      for (kernels::DType d : t.dtypes) {
        const int slot = static_cast<int>(d);
        if (slot < 0 || slot >= kDTypeSlots) continue;
        launches.metric.push_back(counter(
            {{"dtype", std::string(kernels::DTypeName(d))},
             {"op", std::string(ops[i].name)}},
            launches_[i].by_dtype[slot].load(std::memory_order_relaxed)));
      }
    }
  }
  families->push_back(std::move(launches));

  prometheus::MetricFamily commands{"opserver_pipeline_commands_total",
                                    "Pipeline commands applied, by kind.",
                                    MetricType::Counter,
                                    {}};
  const google::protobuf::Descriptor* command =
      v1::PipelineCommand::descriptor();
  for (int i = 0; i < command->field_count(); ++i) {
    const int number = command->field(i)->number();
    if (number <= 0 || number >= kCommandSlots) continue;
    commands.metric.push_back(
        counter({{"command", command->field(i)->name()}},
                commands_.by_case[number].load(std::memory_order_relaxed)));
  }
  families->push_back(std::move(commands));
  families->push_back(prometheus::MetricFamily{
      "opserver_pipeline_batches_total",
      "Pipeline batches applied.",
      MetricType::Counter,
      {counter({}, commands_.batches.load(std::memory_order_relaxed))}});
  families->push_back(prometheus::MetricFamily{
      "opserver_pipeline_deferred_errors_total",
      "Deferred errors reported by fences.",
      MetricType::Counter,
      {counter({},
               commands_.deferred_errors.load(std::memory_order_relaxed))}});
  families->push_back(prometheus::MetricFamily{
      "opserver_graph_replays_total",
      "Graph replays queued (Pipeline's replay_graph and ReplayGraph).",
      MetricType::Counter,
      {counter({}, commands_.graph_replays.load(std::memory_order_relaxed))}});
  families->push_back(
      prometheus::MetricFamily{"opserver_graph_replayed_tasks_total",
                               "Tasks of the graph replays queued.",
                               MetricType::Counter,
                               {counter({}, commands_.graph_replayed_tasks.load(
                                                std::memory_order_relaxed))}});

  prometheus::ClientMetric wait;
  wait.histogram.sample_sum =
      static_cast<double>(queue_wait_.sum_ns.load(std::memory_order_relaxed)) /
      1e9;
  uint64_t cumulative = 0;
  const auto& bounds = A66Buckets();
  for (int i = 0; i <= kWaitBuckets; ++i) {
    cumulative += queue_wait_.buckets[i].load(std::memory_order_relaxed);
    prometheus::ClientMetric::Bucket bucket;
    bucket.cumulative_count = cumulative;
    bucket.upper_bound =
        i < kWaitBuckets ? bounds[i] : std::numeric_limits<double>::infinity();
    wait.histogram.bucket.push_back(bucket);
  }
  wait.histogram.sample_count = cumulative;
  families->push_back(
      prometheus::MetricFamily{"opserver_stream_queue_wait_seconds",
                               "How long launches waited on their stream.",
                               MetricType::Histogram,
                               {std::move(wait)}});
}

}  // namespace opserver
