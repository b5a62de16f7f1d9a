#include "bench/soak_library_scenarios.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/soak_reference.h"
#include "bench/soak_scenarios.h"
#include "client/command_channel.h"
#include "kernels/dtype.h"

namespace opserver::soak {
namespace {

using remote::DeviceBuffer;
using remote::Executor;
using remote::TensorDesc;

kernels::DType K(DataType dt) { return static_cast<kernels::DType>(dt); }

class LibraryClient {
 public:
  explicit LibraryClient(const LibraryClientOptions& o)
      : o_(o), stats_(o.stats), rng_(o.seed) {
    o_.connect.data_path = o.data_path;
    // Split from 8 MiB (rather than 32) so that the soak's transfers of 9
    // and 16 MiB are split where the data path is not used.
    o_.connect.transfer_split_bytes = 8ull << 20;
    o_.connect.transfer_connections = 3;
    // A loaded machine (64 clients, ASan) may take more than the default
    // 5 s to connect; that is not what the soak checks.
    o_.connect.connect_timeout = absl::Seconds(30);
    o_.connect.wait_timeout = kTransferDeadline;
    o_.connect.call_timeout = kCallDeadline;
  }

  void Run(absl::Time end, const std::atomic<bool>* stop) {
    bool first = true;
    while (absl::Now() < end && !stop->load()) {
      if (!EnsureSession()) {
        absl::SleepFor(absl::Milliseconds(100));
        continue;
      }
      if (first) {
        Transfer(8ull << 20);
        first = false;
        continue;
      }
      const uint64_t r = Rand(100);
      if (r < 40) {
        Compute();
      } else if (r < 65) {
        Transfer(0);
      } else if (r < 82) {
        Pipeline();
      } else if (r < 95) {
        Refused();
      } else {
        CloseSession();
      }
    }
    CloseSession();
    client_.reset();
  }

 private:
  uint64_t Rand(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool Chance(double p) {
    return std::uniform_real_distribution<double>(0, 1)(rng_) < p;
  }
  template <typename T>
  const T& PickOf(const std::vector<T>& v) {
    return v[Rand(v.size())];
  }

  // Records a library call; true when it was OK.
  bool Rec(const char* what, const absl::Status& status,
           const Expect& e = Valid()) {
    stats_->Record(what, e, FromAbsl(status));
    return status.ok();
  }

  bool EnsureSession() {
    if (session_ != nullptr) return true;
    if (client_ == nullptr) {
      auto client = remote::Client::Connect(o_.address, o_.connect);
      if (!Rec("client Connect", client.status())) return false;
      client_ = *std::move(client);
    }
    auto session = client_->CreateSession(
        absl::StrCat("soak library client ", o_.id), Chance(0.5));
    if (!Rec("client CreateSession", session.status())) return false;
    session_ = *std::move(session);
    PublishSessionName(o_.tenant, session_->token());
    return true;
  }

  void CloseSession() {
    if (session_ == nullptr) return;
    streams_.clear();  // Handles must not outlive their session.
    Rec("client Close", session_->Close());
    session_.reset();
    // Sometimes the whole client goes too: a fresh connection (and a fresh
    // data-path and transfer-connection setup) next time.
    if (Chance(0.3)) client_.reset();
  }

  // Stream 0 or one of up to two others, made when needed.
  uint64_t PickStream() {
    if (Chance(0.5)) return 0;
    if (streams_.size() < 2) {
      auto stream = session_->CreateStream();
      if (!Rec("client CreateStream", stream.status())) return 0;
      streams_.push_back(*std::move(stream));
    }
    return streams_[Rand(streams_.size())].handle();
  }

  absl::StatusOr<DeviceBuffer> Malloc(uint64_t size) {
    auto buffer = session_->Malloc(size);
    Rec("client Malloc", buffer.status());
    return buffer;
  }

  // Bytes into a buffer the way a user picks: queued on the command channel
  // (small), typed values, or an Upload (the data path from 4 MiB, split
  // from 8 MiB without it).
  bool Put(uint64_t buffer, DataType dt, const std::vector<double>& values,
           const std::string& bytes, uint64_t stream) {
    if (bytes.size() <= remote::kMaxPipelinedBytes && Chance(0.5)) {
      return Rec(
          "client WriteAsync",
          session_->WriteAsync(buffer, 0, bytes.data(), bytes.size(), stream));
    }
    if (values.size() <= kMaxValues && Chance(0.3)) {
      return Rec("client WriteValues",
                 session_->WriteValues(buffer, 0, K(dt), values, stream));
    }
    return Rec("client Upload",
               session_->Upload(buffer, 0, bytes.data(), bytes.size(), stream));
  }

  // Bytes out: a queued read, typed values or a Download.
  bool Get(uint64_t buffer, DataType dt, int64_t n, uint64_t stream,
           std::vector<double>* got) {
    const uint64_t size = static_cast<uint64_t>(n) * DSize(dt);
    std::string bytes(size, '\0');
    if (size <= remote::kMaxPipelinedBytes && Chance(0.5)) {
      auto pending = session_->ReadAsync(buffer, 0, bytes.data(), size, stream);
      if (!Rec("client ReadAsync", pending.status())) return false;
      if (!Rec("client PendingRead.Wait", pending->Wait())) return false;
    } else if (static_cast<uint64_t>(n) <= kMaxValues && Chance(0.3)) {
      auto values = session_->ReadValues(buffer, 0, K(dt), n, stream);
      if (!Rec("client ReadValues", values.status())) return false;
      *got = *std::move(values);
      return true;
    } else if (!Rec(
                   "client Download",
                   session_->Download(buffer, 0, bytes.data(), size, stream))) {
      return false;
    }
    got->resize(n);
    for (int64_t i = 0; i < n; ++i) {
      (*got)[i] = DecodeValue(dt, bytes.data() + i * DSize(dt));
    }
    return true;
  }

  // One operator end to end, contiguous tensors, up to 4 MiB each (so the
  // inputs and the result cross the data path too), checked.
  bool Compute() {
    const int op = static_cast<int>(Rand(kNumOps));
    const DataType dt = PickOf(OpDTypes(op));
    static const std::vector<int64_t> kSizes = {
        1, 3, 64, 1000, 4096, 65536, 1 << 20, (1 << 20) + 5};
    const int64_t n = kSizes[Rand(Chance(0.85) ? 6 : kSizes.size())];
    v1::OpParams params;
    params.set_threshold(IsIntegral(dt)
                             ? static_cast<double>(Rand(41)) - 20
                             : (static_cast<double>(Rand(33)) - 16) * 0.25);
    params.set_lambd(static_cast<double>(Rand(17)) * 0.25);
    static const std::vector<double> kScales = {0, 1, 1.25, 2, 4};
    params.set_scale(PickOf(kScales));
    if (op == kLeakyReluBackward) {
      static const std::vector<double> kSlopes = {0, 0.125, 0.25, 0.5, 1.5};
      params.mutable_negative_slope()->set_dtype(v1::FLOAT);
      params.mutable_negative_slope()->set_value(PickOf(kSlopes));
    }
    auto value = [&] {
      return InputValue(dt, [this](uint64_t n) { return Rand(n); });
    };
    std::vector<double> grad(n), second;
    for (double& v : grad) v = value();
    const int64_t mask_bytes = n / 128 * 16 + (n % 128 != 0 ? 16 : 0);
    if (op == kDropoutBackward) {
      second.resize(mask_bytes);
      for (double& v : second) v = static_cast<double>(Rand(256));
    } else {
      second.resize(n);
      for (double& v : second) v = value();
    }
    std::vector<double> want(n);
    for (int64_t i = 0; i < n; ++i) {
      const bool bit = op == kDropoutBackward &&
                       ((static_cast<int>(second[i / 8]) >> (i % 8)) & 1);
      want[i] = Reference(op, dt, params, grad[i],
                          op == kDropoutBackward ? 0.0 : second[i], bit);
    }
    const DataType second_dt = op == kDropoutBackward ? v1::UINT8 : dt;
    const std::string grad_bytes = Encode(dt, grad);
    const std::string second_bytes = Encode(second_dt, second);

    auto g = Malloc(grad_bytes.size());
    if (!g.ok()) return false;
    auto x = Malloc(second_bytes.size());
    if (!x.ok()) return false;
    auto out = Malloc(static_cast<uint64_t>(n) * DSize(dt));
    if (!out.ok()) return false;
    const uint64_t stream = PickStream();
    if (!Put(g->handle(), dt, grad, grad_bytes, stream) ||
        !Put(x->handle(), second_dt, second, second_bytes, stream)) {
      return false;
    }
    std::map<std::string, TensorDesc> tensors;
    tensors["gradOutput"] = TensorDesc::Contiguous(g->handle(), K(dt), {n});
    tensors[SecondName(op)] = TensorDesc::Contiguous(
        x->handle(), K(second_dt), {op == kDropoutBackward ? mask_bytes : n});
    tensors[OutName(op)] = TensorDesc::Contiguous(out->handle(), K(dt), {n});
    auto executor = session_->GetWorkspaceSize(kOpNames[op], params, tensors);
    if (!Rec("client GetWorkspaceSize", executor.status())) return false;
    DeviceBuffer workspace;
    if (executor->workspace_size() > 0) {
      auto ws = Malloc(executor->workspace_size());
      if (!ws.ok()) return false;
      workspace = *std::move(ws);
    }
    if (!Launch(*executor, stream, workspace)) return false;
    if (Chance(0.3) &&
        !Rec("client Synchronize", session_->Synchronize(stream))) {
      return false;
    }
    // The buffers' frees are queued as they go out of scope; their
    // outcome is the session's deferred error, which Flush reports.
    return CheckResult(op, dt, out->handle(), stream, want, grad);
  }

  // Launches `executor` once, or made repeatable one to three times.
  bool Launch(remote::Executor& executor, uint64_t stream,
              const DeviceBuffer& workspace) {
    const bool repeat = Chance(0.25);
    if (repeat && !Rec("client SetRepeatable", executor.SetRepeatable())) {
      return false;
    }
    const int launches = repeat ? 1 + static_cast<int>(Rand(3)) : 1;
    for (int i = 0; i < launches; ++i) {
      if (!Rec("client Execute",
               executor.Execute(stream,
                                workspace.valid() ? workspace.handle() : 0))) {
        return false;
      }
    }
    return true;
  }

  // Reads `out` back on `stream` and compares it with `want`.
  bool CheckResult(int op, DataType dt, uint64_t out, uint64_t stream,
                   const std::vector<double>& want,
                   const std::vector<double>& grad) {
    const int64_t n = static_cast<int64_t>(want.size());
    std::vector<double> got;
    if (!Get(out, dt, n, stream, &got)) return false;
    if (got.size() != static_cast<size_t>(n)) {
      stats_->Problem("client_result_size",
                      absl::StrCat(got.size(), " of ", n));
      return false;
    }
    for (int64_t i = 0; i < n; ++i) {
      if (!CloseEnough(dt, got[i], want[i], grad[i])) {
        stats_->Problem(
            "client_wrong_result",
            absl::StrCat(kOpNames[op], " ", v1::DataType_Name(dt), " n=", n,
                         ": element ", i, " is ", got[i], ", want ", want[i]));
        return false;
      }
    }
    return true;
  }

  // Bytes up and down through Upload/Download (the data path or split
  // transfers for the large ones), at an offset, whole or in two parts;
  // compared. `fixed`: that size, else a random one.
  bool Transfer(uint64_t fixed) {
    static const std::vector<uint64_t> kSizes = {
        1, 4095, 65537, (1 << 20) + 3, 4 << 20, (9 << 20) + 7, 16 << 20};
    const uint64_t size =
        fixed != 0 ? fixed : kSizes[Rand(Chance(0.6) ? 4 : kSizes.size())];
    const uint64_t offset = Chance(0.3) ? 64 * Rand(8) : 0;
    std::string data(size, '\0');
    for (uint64_t i = 0; i < size; i += 8) {
      const uint64_t r = rng_();
      std::memcpy(data.data() + i, &r, std::min<uint64_t>(8, size - i));
    }
    auto buffer = Malloc(offset + size);
    if (!buffer.ok()) return false;
    const uint64_t stream = PickStream();
    if (Chance(0.3) && size > 1) {
      const uint64_t split = 1 + Rand(size - 1);
      if (!Rec("client Upload", session_->Upload(buffer->handle(), offset,
                                                 data.data(), split, stream)) ||
          !Rec("client Upload",
               session_->Upload(buffer->handle(), offset + split,
                                data.data() + split, size - split, stream))) {
        return false;
      }
    } else if (!Rec("client Upload",
                    session_->Upload(buffer->handle(), offset, data.data(),
                                     size, stream))) {
      return false;
    }
    uint64_t from = 0, len = size;
    if (Chance(0.4)) {
      from = Rand(size);
      len = Rand(size - from + 1);
    }
    std::string back(len, '\0');
    if (!Rec("client Download",
             session_->Download(buffer->handle(), offset + from, back.data(),
                                len, stream))) {
      return false;
    }
    if (std::memcmp(back.data(), data.data() + from, len) != 0) {
      stats_->Problem("client_transfer_mismatch",
                      absl::StrCat("download of [", from, ", +", len, ") of ",
                                   size, " differs from what was uploaded"));
      return false;
    }
    if (Chance(0.5)) return Rec("client FreeBuffer", buffer->Free());
    return true;
  }

  // Many launches of one repeatable executor queued without a round trip,
  // small writes in between (of inputs the launches after them see), and a
  // queued read of the result; checked.
  bool Pipeline() {
    const int64_t n = 4096;
    auto g = Malloc(n * 4);
    auto x = Malloc(n * 4);
    auto out = Malloc(n * 4);
    if (!g.ok() || !x.ok() || !out.ok()) return false;
    std::vector<double> grad(n), self(n);
    for (int64_t i = 0; i < n; ++i) {
      grad[i] = (static_cast<double>(Rand(48)) - 24 + 0.5) * 0.25;
      self[i] = (static_cast<double>(Rand(48)) - 24 + 0.5) * 0.25;
    }
    const uint64_t stream = PickStream();
    std::string grad_bytes = Encode(v1::FLOAT, grad);
    if (!Rec("client WriteAsync",
             session_->WriteAsync(g->handle(), 0, grad_bytes.data(),
                                  grad_bytes.size(), stream))) {
      return false;
    }
    const std::string self_bytes = Encode(v1::FLOAT, self);
    if (!Rec("client WriteAsync",
             session_->WriteAsync(x->handle(), 0, self_bytes.data(),
                                  self_bytes.size(), stream))) {
      return false;
    }
    auto executor = session_->HardswishBackward(
        TensorDesc::Contiguous(g->handle(), kernels::DType::kFloat, {n}),
        TensorDesc::Contiguous(x->handle(), kernels::DType::kFloat, {n}),
        TensorDesc::Contiguous(out->handle(), kernels::DType::kFloat, {n}));
    if (!Rec("client HardswishBackward", executor.status()) ||
        !Rec("client SetRepeatable", executor->SetRepeatable())) {
      return false;
    }
    const int launches = 16 + static_cast<int>(Rand(240));
    for (int i = 0; i < launches; ++i) {
      if (i == launches / 2) {
        // The gradient changes halfway: the later launches must see it.
        for (double& v : grad) v = -v;
        grad_bytes = Encode(v1::FLOAT, grad);
        if (!Rec("client WriteAsync",
                 session_->WriteAsync(g->handle(), 0, grad_bytes.data(),
                                      grad_bytes.size(), stream))) {
          return false;
        }
      }
      if (!Rec("client Execute", executor->Execute(stream))) return false;
    }
    std::string bytes(n * 4, '\0');
    auto pending = session_->ReadAsync(out->handle(), 0, bytes.data(),
                                       bytes.size(), stream);
    if (!Rec("client ReadAsync", pending.status()) ||
        !Rec("client PendingRead.Wait", pending->Wait())) {
      return false;
    }
    v1::OpParams params;
    for (int64_t i = 0; i < n; ++i) {
      const double got = DecodeValue(v1::FLOAT, bytes.data() + i * 4);
      const double want = Reference(kHardswishBackward, v1::FLOAT, params,
                                    grad[i], self[i], false);
      if (!CloseEnough(v1::FLOAT, got, want, grad[i])) {
        stats_->Problem("client_pipeline_result",
                        absl::StrCat("element ", i, " is ", got, ", want ",
                                     want, " after ", launches, " launches"));
        return false;
      }
    }
    return Rec("client Destroy", executor->Destroy());
  }

  // Requests the library or the server refuses, on purpose. Each error may
  // come from the call itself or, pipelined, as the deferred error of the
  // Flush after it; both are classified with the request's category.
  void Refused() {
    const uint32_t kOk = Bit(StatusCode::OK);
    auto buffer = Malloc(4096);
    if (!buffer.ok()) return;
    switch (Rand(4)) {
      case 0: {  // Shapes ThresholdBackward does not broadcast.
        const Expect e =
            Invalid("bad_shape", Bit(StatusCode::INVALID_ARGUMENT));
        auto executor = session_->ThresholdBackward(
            TensorDesc::Contiguous(buffer->handle(), kernels::DType::kFloat,
                                   {4}),
            TensorDesc::Contiguous(buffer->handle(), kernels::DType::kFloat,
                                   {2}),
            0.5,
            TensorDesc::Contiguous(buffer->handle(), kernels::DType::kFloat,
                                   {4}));
        Rec("client ThresholdBackward", executor.status(), e);
        break;
      }
      case 1: {  // A buffer nobody made.
        const Expect e = Invalid("unknown_handle", Bit(StatusCode::NOT_FOUND));
        const char bytes[4] = {1, 2, 3, 4};
        Rec("client Upload",
            session_->Upload((1ull << 60) + Rand(1000), 0, bytes, 4), e);
        break;
      }
      case 2: {  // A range past the end of the buffer.
        const Expect e =
            Invalid("bad_range", Bit(StatusCode::INVALID_ARGUMENT) |
                                     Bit(StatusCode::OUT_OF_RANGE));
        std::string bytes(64, '\0');
        Rec("client Download",
            session_->Download(buffer->handle(), 4090, bytes.data(), 64), e);
        break;
      }
      default: {  // A single-use executor launched twice.
        const Expect e =
            Invalid("consumed_executor", Bit(StatusCode::FAILED_PRECONDITION) |
                                             Bit(StatusCode::NOT_FOUND));
        auto executor = session_->HardswishBackward(
            TensorDesc::Contiguous(buffer->handle(), kernels::DType::kFloat,
                                   {16}),
            TensorDesc::Contiguous(buffer->handle(), kernels::DType::kFloat,
                                   {16}),
            TensorDesc::Contiguous(buffer->handle(), kernels::DType::kFloat,
                                   {16}));
        if (!Rec("client HardswishBackward", executor.status()) ||
            !Rec("client Execute", executor->Execute())) {
          return;
        }
        Expect either = e;
        either.codes |= kOk;  // Refused here, or deferred to the Flush.
        Rec("client Execute", executor->Execute(), either);
        Rec("client Flush", session_->Flush(), either);
        return;
      }
    }
    Rec("client Flush", session_->Flush());
  }

  LibraryClientOptions o_;
  Stats* const stats_;
  std::mt19937_64 rng_;
  std::unique_ptr<remote::Client> client_;
  std::unique_ptr<remote::Session> session_;
  std::vector<remote::Stream> streams_;
};

}  // namespace

void RunLibraryClient(const LibraryClientOptions& options, absl::Time end,
                      const std::atomic<bool>* stop) {
  LibraryClient client(options);
  client.Run(end, stop);
}

}  // namespace opserver::soak
