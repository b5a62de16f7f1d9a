// The raw-RPC client's main valid scenario: one operator, dtype, size and
// layout drawn at random, its inputs uploaded, planned, launched (once, or
// a repeatable executor several times, unary or on ExecuteStream) and its
// result read back and checked against the host reference
// (soak_reference.h). The draws come in the same order in every run of a
// seed.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/soak_reference.h"
#include "bench/soak_rpc_client.h"

namespace opserver::soak::rpc {

// One Compute call's operator, inputs, buffers and launch.
struct ComputeCase {
  enum Layout { kContig, kStrided, kBroadcast, kPacked, kInPlace };

  int op = 0;
  DataType dt = v1::FLOAT;
  int dsize = 0;
  int64_t n = 0;
  Layout layout = kContig;
  bool strided_mask = false;
  v1::OpParams params;
  // gradOutput [rows, cols] when broadcast, else [n].
  int64_t rows = 1, cols = 0;
  std::vector<double> grad, second;  // second: self, or the mask's bytes.
  int64_t mask_bytes = 0;
  std::vector<double> want, grad_at;  // The reference, per element.
  DataType second_dt = v1::FLOAT;
  std::string grad_bytes, second_bytes;
  uint64_t out_bytes = 0;
  // Device memory.
  uint64_t grad_buf = 0, second_buf = 0, out_buf = 0;
  uint64_t grad_off = 0, second_off = 0, out_off = 0;
  std::vector<uint64_t> mine;  // What this call frees at the end.
  uint64_t stream = 0;
  uint64_t executor = 0, workspace = 0, ws_buf = 0, ws_off = 0;
};

bool Client::Compute() {
  ComputeCase c = DrawCompute();
  DrawComputeInputs(c);
  if (!PlaceCompute(c) || !PlanCompute(c) || !LaunchCompute(c) ||
      !CheckCompute(c)) {
    return false;
  }
  // Free what this used (sometimes keep it: the session close frees it).
  if (Chance(0.85)) {
    for (uint64_t b : c.mine) {
      if (!Free(&main_, b)) return false;
    }
  }
  return true;
}

ComputeCase Client::DrawCompute() {
  using Layout = ComputeCase::Layout;
  ComputeCase c;
  c.op = static_cast<int>(Rand(kNumOps));
  c.dt = PickOf(OpDTypes(c.op));
  c.dsize = DSize(c.dt);
  static const std::vector<int64_t> kSizes = {1,    3,     64,    1000,
                                              4096, 65536, 262144};
  c.n = kSizes[Rand(Chance(0.9) ? 5 : kSizes.size())];
  std::vector<Layout> layouts = {ComputeCase::kContig, ComputeCase::kStrided,
                                 ComputeCase::kPacked};
  if (c.op == kSoftshrinkBackward || c.op == kLeakyReluBackward) {
    layouts.push_back(ComputeCase::kBroadcast);
  }
  if (c.op != kDropoutBackward) layouts.push_back(ComputeCase::kInPlace);
  c.layout = Chance(0.4) ? ComputeCase::kContig : PickOf(layouts);
  c.strided_mask = c.op == kDropoutBackward && Chance(0.4);

  // Parameters.
  c.params.set_threshold(IsIntegral(c.dt)
                             ? static_cast<double>(Rand(41)) - 20
                             : (static_cast<double>(Rand(33)) - 16) * 0.25);
  c.params.set_lambd(static_cast<double>(Rand(17)) * 0.25);
  static const std::vector<double> kSlopes = {0, 0.125, 0.25, 0.5, 1.5};
  c.params.mutable_negative_slope()->set_dtype(v1::FLOAT);
  c.params.mutable_negative_slope()->set_value(PickOf(kSlopes));
  static const std::vector<double> kScales = {0, 1, 1.25, 2, 4};
  c.params.set_scale(PickOf(kScales));
  return c;
}

void Client::DrawComputeInputs(ComputeCase& c) {
  const int64_t n = c.n;
  auto value = [&] {
    return InputValue(c.dt, [this](uint64_t n) { return Rand(n); });
  };
  c.cols = n;
  if (c.layout == ComputeCase::kBroadcast) {
    for (int64_t r : {8, 4, 2, 1}) {
      if (n % r == 0) {
        c.rows = r;
        break;
      }
    }
    c.cols = n / c.rows;
  }
  const bool strided = c.layout == ComputeCase::kStrided;
  c.grad.resize(strided ? 2 * n + 1 : n);
  for (double& v : c.grad) v = value();
  if (c.op == kDropoutBackward) {
    c.mask_bytes = n / 128 * 16 + (n % 128 != 0 ? 16 : 0);
    c.second.resize(c.strided_mask ? 2 * c.mask_bytes : c.mask_bytes);
    for (double& v : c.second) v = static_cast<double>(Rand(256));
  } else {
    c.second.resize(c.layout == ComputeCase::kBroadcast ? c.cols : n);
    for (double& v : c.second) v = value();
  }
  c.want.resize(n);
  c.grad_at.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = strided ? c.grad[1 + 2 * i] : c.grad[i];
    double x = 0;
    bool bit = false;
    if (c.op == kDropoutBackward) {
      const int64_t byte = i / 8;
      const int mask =
          static_cast<int>(c.second[c.strided_mask ? 2 * byte : byte]);
      bit = (mask >> (i % 8)) & 1;
    } else {
      x = c.layout == ComputeCase::kBroadcast ? c.second[i % c.cols]
                                              : c.second[i];
    }
    c.want[i] = Reference(c.op, c.dt, c.params, g, x, bit);
    c.grad_at[i] = g;
  }
  c.second_dt = c.op == kDropoutBackward ? v1::UINT8 : c.dt;
  c.grad_bytes = Encode(c.dt, c.grad);
  c.second_bytes = Encode(c.second_dt, c.second);
  c.out_bytes = static_cast<uint64_t>(n) * c.dsize;
}

bool Client::PlaceCompute(ComputeCase& c) {
  SessionState* s = &main_;
  auto align = [](uint64_t x) { return (x + 63) / 64 * 64; };
  if (c.layout == ComputeCase::kPacked) {
    c.second_off = align(c.grad_bytes.size()) + 64 * Rand(3);
    c.out_off = align(c.second_off + c.second_bytes.size());
    c.grad_buf = c.second_buf = c.out_buf = Malloc(s, c.out_off + c.out_bytes);
    if (c.grad_buf == 0) return false;
    c.mine = {c.grad_buf};
  } else {
    c.grad_buf = Malloc(s, c.grad_bytes.size());
    if (c.grad_buf == 0) return false;
    c.second_buf = Malloc(s, c.second_bytes.size());
    if (c.second_buf == 0) return false;
    c.mine = {c.grad_buf, c.second_buf};
    if (c.layout == ComputeCase::kInPlace) {
      c.out_buf = c.grad_buf;
    } else {
      c.out_buf = Malloc(s, c.out_bytes);
      if (c.out_buf == 0) return false;
      c.mine.push_back(c.out_buf);
    }
  }
  c.stream = PickStream();
  // Inputs go up by Upload (any chunking) or WriteValues.
  auto put = [&](uint64_t buffer, uint64_t offset, DataType type,
                 const std::vector<double>& values, const std::string& bytes) {
    if (Chance(0.5) && values.size() <= kMaxValues) {
      return WriteValues(s, buffer, offset, type, values, c.stream, V()).ok();
    }
    static const std::vector<uint64_t> kChunks = {100, 4096, 65536, 1 << 20};
    return Upload(s, buffer, offset, bytes, c.stream, PickOf(kChunks), V(),
                  Chance(0.3))
        .ok();
  };
  return put(c.grad_buf, c.grad_off, c.dt, c.grad, c.grad_bytes) &&
         put(c.second_buf, c.second_off, c.second_dt, c.second, c.second_bytes);
}

bool Client::PlanCompute(ComputeCase& c) {
  SessionState* s = &main_;
  const int64_t n = c.n;
  const DataType dt = c.dt;
  v1::GetWorkspaceSizeRequest request;
  request.set_op(Chance(0.2) ? absl::StrCat("aclnn", kOpNames[c.op])
                             : kOpNames[c.op]);
  *request.mutable_params() = c.params;
  if (c.op != kLeakyReluBackward) {
    request.mutable_params()->clear_negative_slope();
  }
  auto& tensors = *request.mutable_tensors();
  std::vector<int64_t> shape = c.layout == ComputeCase::kBroadcast
                                   ? std::vector<int64_t>{c.rows, c.cols}
                                   : std::vector<int64_t>{n};
  tensors["gradOutput"] = c.layout == ComputeCase::kStrided
                              ? Desc(c.grad_buf, dt, {n}, {2}, 1, c.grad_off)
                              : Desc(c.grad_buf, dt, shape, {}, 0, c.grad_off);
  if (c.op == kDropoutBackward) {
    tensors["mask"] = c.strided_mask
                          ? Desc(c.second_buf, v1::UINT8, {c.mask_bytes}, {2},
                                 0, c.second_off)
                          : Desc(c.second_buf, v1::UINT8, {c.mask_bytes}, {}, 0,
                                 c.second_off);
  } else if (c.layout == ComputeCase::kBroadcast) {
    tensors["self"] = Desc(c.second_buf, dt, {1, c.cols}, {}, 0, c.second_off);
  } else {
    tensors["self"] = Desc(c.second_buf, dt, shape, {}, 0, c.second_off);
  }
  tensors[OutName(c.op)] = Desc(c.out_buf, dt, shape, {}, 0, c.out_off);
  c.executor = GetWorkspaceSize(s, request, &c.workspace, V());
  if (c.executor == 0) return false;
  if (c.strided_mask && c.workspace != static_cast<uint64_t>(c.mask_bytes) &&
      mode_ == Mode::kSoak) {
    stats_->Problem("workspace_size",
                    absl::StrCat("strided mask of ", c.mask_bytes,
                                 " bytes, workspace ", c.workspace));
  }
  // Freed handles stay alive in the executor: results must not change.
  if (c.layout != ComputeCase::kPacked && c.layout != ComputeCase::kInPlace &&
      Chance(0.15)) {
    if (!Free(s, c.grad_buf) || !Free(s, c.second_buf)) return false;
    c.mine = {c.out_buf};
  }
  if (c.workspace > 0) {
    c.ws_off = 64 * Rand(4);
    c.ws_buf = Malloc(s, c.ws_off + c.workspace + Rand(100));
    if (c.ws_buf == 0) return false;
    c.mine.push_back(c.ws_buf);
  }
  return true;
}

// Phase two: once, or a repeatable executor several times (not in place:
// a second launch would compute on the first one's output).
bool Client::LaunchCompute(ComputeCase& c) {
  SessionState* s = &main_;
  const bool repeat = c.layout != ComputeCase::kInPlace && Chance(0.25);
  if (repeat && !SetRepeatable(s, c.executor, V()).ok()) return false;
  const int launches = repeat ? 1 + static_cast<int>(Rand(3)) : 1;
  std::vector<v1::ExecuteRequest> requests;
  for (int i = 0; i < launches; ++i) {
    requests.push_back(LaunchRequest(s, c.executor, c.stream, c.ws_buf,
                                     c.ws_off, c.workspace));
  }
  if (Chance(0.3)) {
    std::vector<Expect> expects(requests.size(), V());
    if (!ExecuteStream(s, requests, expects, V())) return false;
  } else {
    for (const auto& r : requests) {
      if (!Execute(s, r, V()).ok()) return false;
    }
  }
  return !repeat || DestroyExecutor(s, c.executor, V()).ok();
}

// Reads the result back on the same stream (ordered after the launch with
// or without a synchronize first) and checks every element.
bool Client::CheckCompute(const ComputeCase& c) {
  SessionState* s = &main_;
  const int64_t n = c.n;
  if (Chance(0.5) && !Sync(s, c.stream)) return false;
  std::vector<double> got;
  if (Chance(0.5) && static_cast<uint64_t>(n) <= kMaxValues) {
    if (!ReadValues(s, c.out_buf, c.out_off, c.dt, n, c.stream, &got, V())
             .ok()) {
      return false;
    }
  } else {
    std::string bytes;
    if (!Download(s, c.out_buf, c.out_off, c.out_bytes, c.stream, &bytes, V())
             .ok() ||
        bytes.size() != c.out_bytes) {
      return false;
    }
    got.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      got[i] = DecodeValue(c.dt, bytes.data() + i * c.dsize);
    }
  }
  if (got.size() != static_cast<size_t>(n)) {
    stats_->Problem("result_size", absl::StrCat(got.size(), " of ", n));
    return false;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!CloseEnough(c.dt, got[i], c.want[i], c.grad_at[i])) {
      stats_->Problem(
          "wrong_result",
          absl::StrCat(kOpNames[c.op], " ", v1::DataType_Name(c.dt), " n=", n,
                       " layout=", c.layout,
                       c.strided_mask ? " strided mask" : "", ": element ", i,
                       " is ", got[i], ", want ", c.want[i]));
      return false;
    }
  }
  return Sync(s, c.stream);
}

}  // namespace opserver::soak::rpc
