// The raw-RPC client's invalid requests, made on purpose: each names the
// category of error that explains its outcome (soak_report.cc). Those
// naming handles and sessions that are not the caller's to use are in
// soak_handle_scenarios.cc.

#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/soak_reference.h"
#include "bench/soak_rpc_client.h"

namespace opserver::soak::rpc {

void Client::InvalidScenario() {
  switch (Rand(20)) {
    case 0:  // A made-up or empty session, on any RPC.
    case 1:
      BadSession();
      break;
    case 2:  // Another session's buffer.
      ForeignBuffer();
      break;
    case 3:  // Another session's executor.
      ForeignExecutor();
      break;
    case 4:  // Another session's stream.
      ForeignStream();
      break;
    case 5:  // Handles nobody made.
      UnknownHandle();
      break;
    case 6:  // A freed buffer.
      FreedBuffer();
      break;
    case 7:  // A consumed executor.
      ConsumedExecutor();
      break;
    case 8:
    case 9:
      BadShape();
      break;
    case 10:
      BadDType();
      break;
    case 11:
      BadParam();
      break;
    case 12:  // Past a limit.
      Oversized();
      break;
    case 13:  // Ranges outside the buffer.
      BadRange();
      break;
    case 14:  // Uploads that break their own header.
      BadUpload();
      break;
    case 15:  // Values that do not fit their dtype.
      BadValue();
      break;
    case 16:
      SmallWorkspace();
      break;
    case 17:  // Stream 0, destroyed and too many streams.
      StreamMisuse();
      break;
    case 18:  // Session-level misuse.
      SessionMisuse();
      break;
    default:
      MixedPipeline();
      break;
  }
}

// Past a limit.
void Client::Oversized() {
  SessionState* s = &main_;
  const Expect e = Invalid("oversized", kExhausted);
  switch (Rand(8)) {
    case 0:
      Malloc(s, 1ull << 40, e);
      break;
    case 1:
      Malloc(s, UINT64_MAX, e);
      break;
    case 2:
    case 3:
    case 4: {
      uint64_t b = AnyBuffer();
      if (b != 0) {
        ReadValues(s, b, 0, v1::UINT8, kMaxValues + 1, 0, nullptr, e);
      }
      break;
    }
    case 5: {  // 8 MiB of values: rarely.
      uint64_t b = AnyBuffer();
      if (b != 0) {
        WriteValues(s, b, 0, v1::UINT8, std::vector<double>(kMaxValues + 1, 0),
                    0, e);
      }
      break;
    }
    default: {
      v1::EvaluateRequest request;
      request.set_op("HardswishBackward");
      for (const char* name : {"gradOutput", "self"}) {
        v1::ValueTensor& t = (*request.mutable_inputs())[name];
        t.set_dtype(v1::FLOAT);
        t.add_shape(kMaxValues + 1);
      }
      request.mutable_output()->set_dtype(v1::FLOAT);
      request.mutable_output()->add_shape(kMaxValues + 1);
      v1::EvaluateResponse response;
      Expect ee = e;
      ee.evaluate = true;
      Unary("Evaluate", SOAK_OPS(Evaluate), request, &response, ee);
      break;
    }
  }
}

// Ranges outside the buffer.
void Client::BadRange() {
  SessionState* s = &main_;
  const uint64_t b = Malloc(s, 4096);
  if (b == 0) return;
  const Expect e = Invalid("bad_range", kInvalid);
  std::string bytes;
  switch (Rand(5)) {
    case 0:
      Download(s, b, 4095, 2, 0, &bytes, e);
      break;
    case 1:
      Download(s, b, UINT64_MAX, 2, 0, &bytes, e);
      break;
    case 2:
      ReadValues(s, b, 4092, v1::DOUBLE, 1, 0, nullptr, e);
      break;
    case 3:
      WriteValues(s, b, 4096, v1::FLOAT, {1}, 0, e);
      break;
    default:
      Upload(s, b, 4000, std::string(97, 'x'), 0, 64, e);
      break;
  }
  Free(s, b);
}

// Uploads that break their own header.
void Client::BadUpload() {
  SessionState* s = &main_;
  const uint64_t b = Malloc(s, 4096);
  if (b == 0) return;
  const Expect e = Invalid("bad_upload", kInvalid);
  switch (Rand(3)) {
    case 0:  // More data than announced.
      Upload(s, b, 0, std::string(200, 'x'), 0, 64, e, false, 100);
      break;
    case 1:  // Less.
      Upload(s, b, 0, std::string(50, 'x'), 0, 16, e, Chance(0.5), 100);
      break;
    default: {  // Nothing at all.
      grpc::ClientContext context;
      SetDeadline(&context, kCallDeadline);
      v1::UploadResponse response;
      auto writer = conn_->rt->Upload(&context, &response);
      writer->WritesDone();
      Record("Upload", e, writer->Finish(), context);
      break;
    }
  }
  Free(s, b);
}

// Values that do not fit their dtype.
void Client::BadValue() {
  SessionState* s = &main_;
  const uint64_t b = AnyBuffer();
  if (b == 0) return;
  const Expect e = Invalid("bad_value", kInvalid);
  switch (Rand(5)) {
    case 0:
      WriteValues(s, b, 0, v1::INT32, {1.5}, 0, e);
      break;
    case 1:
      WriteValues(s, b, 0, v1::INT32, {std::nan("")}, 0, e);
      break;
    case 2:
      WriteValues(s, b, 0, v1::INT8, {300}, 0, e);
      break;
    case 3:
      WriteValues(s, b, 0, v1::UINT8, {-1}, 0, e);
      break;
    default:
      WriteValues(s, b, 0, v1::BOOL, {2}, 0, e);
      break;
  }
}

// Stream 0, destroyed and too many streams.
void Client::StreamMisuse() {
  SessionState* s = &main_;
  switch (Rand(3)) {
    case 0:
      DestroyStream(s, 0, Invalid("stream0", kInvalid));
      break;
    case 1: {
      const uint64_t stream = CreateStream(s, V());
      if (stream == 0 || !DestroyStream(s, stream, V()).ok()) return;
      Sync(s, stream, Invalid("destroyed_stream", kNotFound));
      break;
    }
    default:
      StreamLimit();
      break;
  }
}

// Session-level misuse.
void Client::SessionMisuse() {
  switch (Rand(3)) {
    case 0: {
      v1::CreateSessionRequest request;
      request.set_client_name(std::string(257, 'n'));
      v1::CreateSessionResponse response;
      Unary("CreateSession", SOAK_RT(CreateSession), request, &response,
            Invalid("long_name", kInvalid));
      break;
    }
    case 1: {
      SessionState other;
      if (!OpenSession(&other, false)) return;
      const std::string token = other.token;
      CloseSession(&other);
      other.token = token;
      const Expect e = Invalid("closed_session", kNotFound);
      if (Chance(0.5)) {
        Malloc(&other, 16, e);
      } else {
        v1::CloseSessionRequest request;
        request.set_session(token);
        v1::CloseSessionResponse response;
        Unary("CloseSession", SOAK_RT(CloseSession), request, &response, e);
      }
      break;
    }
    default: {
      grpc::health::v1::HealthCheckRequest request;
      request.set_service("opserver.v0.Nonexistent");
      grpc::health::v1::HealthCheckResponse response;
      grpc::ClientContext context;
      SetDeadline(&context, kCallDeadline);
      Record("Health.Check", Invalid("unknown_health_service", kNotFound),
             conn_->health->Check(&context, request, &response), context);
      break;
    }
  }
}

void Client::BadShape() {
  const Expect e = Invalid("bad_shape", Bit(StatusCode::INVALID_ARGUMENT));
  const uint64_t b = AnyBuffer(64);
  if (b == 0) return;
  const int64_t elems = static_cast<int64_t>(main_.buffers[b] / 4);
  v1::GetWorkspaceSizeRequest request = TinyThreshold(b);
  auto& t = *request.mutable_tensors();
  switch (Rand(9)) {
    case 0:  // Past the end of the buffer.
      t["self"] = Desc(b, v1::FLOAT, {elems + 1});
      t["gradOutput"] = Desc(b, v1::FLOAT, {elems + 1});
      t["out"] = Desc(b, v1::FLOAT, {elems + 1});
      break;
    case 1:  // 9 dims.
      t["self"] = Desc(b, v1::FLOAT, {1, 1, 1, 1, 1, 1, 1, 1, 1});
      break;
    case 2:  // A negative dim.
      t["gradOutput"] = Desc(b, v1::FLOAT, {-4});
      break;
    case 3:  // Threshold does not broadcast.
      t["self"] = Desc(b, v1::FLOAT, {2});
      break;
    case 4:  // Wrong out shape.
      t["out"] = Desc(b, v1::FLOAT, {2, 2});
      break;
    case 5:  // An output that overlaps itself: 2^40 elements in 4 bytes.
      for (const char* name : {"gradOutput", "self", "out"}) {
        t[name] = Desc(b, v1::FLOAT, {1ll << 40}, {0});
      }
      break;
    case 6:  // Starts past the buffer.
      t["self"] = Desc(b, v1::FLOAT, {4}, {}, 0, main_.buffers[b] + 4096);
      break;
    case 7:  // Strides that overflow.
      t["gradOutput"] = Desc(b, v1::FLOAT, {4}, {1ll << 62});
      break;
    default: {  // A mask of the wrong size.
      request.set_op("DropoutBackward");
      request.mutable_params()->set_scale(2);
      t.erase("self");
      t["mask"] = Desc(b, v1::UINT8, {3});
      break;
    }
  }
  const uint64_t executor = GetWorkspaceSize(&main_, request, nullptr, e);
  if (executor != 0) DestroyExecutor(&main_, executor, V());
}

void Client::BadDType() {
  const Expect e = Invalid("bad_dtype", Bit(StatusCode::INVALID_ARGUMENT));
  const uint64_t b = AnyBuffer(64);
  if (b == 0) return;
  v1::GetWorkspaceSizeRequest request = TinyThreshold(b);
  auto& t = *request.mutable_tensors();
  switch (Rand(6)) {
    case 0:  // Not an aclDataType.
      t["self"].set_dtype(static_cast<DataType>(5));
      break;
    case 1:
      t["out"].set_dtype(static_cast<DataType>(99));
      break;
    case 2:  // Softshrink takes no INT32.
      request.set_op("SoftshrinkBackward");
      t.erase("out");
      for (const char* name : {"gradOutput", "self", "gradInput"}) {
        t[name] = Desc(b, v1::INT32, {4});
      }
      break;
    case 3:  // A FLOAT mask.
      request.set_op("DropoutBackward");
      request.mutable_params()->set_scale(2);
      t.erase("self");
      t["mask"] = Desc(b, v1::FLOAT, {4});
      break;
    case 4:  // Threshold on DOUBLE.
      for (const char* name : {"gradOutput", "self", "out"}) {
        t[name] = Desc(b, v1::DOUBLE, {2});
      }
      break;
    default: {  // WriteValues/ReadValues of dtype 5.
      if (Chance(0.5)) {
        WriteValues(&main_, b, 0, static_cast<DataType>(5), {1}, 0, e);
      } else {
        ReadValues(&main_, b, 0, static_cast<DataType>(5), 1, 0, nullptr, e);
      }
      return;
    }
  }
  const uint64_t executor = GetWorkspaceSize(&main_, request, nullptr, e);
  if (executor != 0) DestroyExecutor(&main_, executor, V());
}

void Client::BadParam() {
  const Expect e = Invalid("bad_param", Bit(StatusCode::INVALID_ARGUMENT));
  const uint64_t b = AnyBuffer(64);
  if (b == 0) return;
  v1::GetWorkspaceSizeRequest request = TinyThreshold(b);
  auto& t = *request.mutable_tensors();
  auto leaky = [&] {
    request.set_op("LeakyReluBackward");
    request.mutable_params()->mutable_negative_slope()->set_dtype(v1::FLOAT);
    request.mutable_params()->mutable_negative_slope()->set_value(0.5);
  };
  switch (Rand(9)) {
    case 0:
      request.set_op("SoftplusBackward");
      break;
    case 1:
      t["bogus"] = t["self"];
      break;
    case 2:
      request.set_op("SoftshrinkBackward");
      request.mutable_params()->set_lambd(-1);
      t["gradInput"] = t["out"];
      t.erase("out");
      break;
    case 3:
    case 4:
      request.set_op("DropoutBackward");
      request.mutable_params()->set_scale(Rand(2) ? 0.5 : std::nan(""));
      t["mask"] = Desc(b, v1::UINT8, {16});
      t.erase("self");
      break;
    case 5:  // The output under another operator's name (it is gradInput).
      request.set_op("SoftshrinkBackward");
      request.mutable_params()->set_lambd(0.5);
      break;
    case 6:  // An integer slope that is not an integer.
      leaky();
      request.mutable_params()->mutable_negative_slope()->set_dtype(v1::INT32);
      break;
    case 7:  // A negative slope with selfIsResult.
      leaky();
      request.mutable_params()->mutable_negative_slope()->set_value(-0.5);
      request.mutable_params()->set_self_is_result(true);
      break;
    default:  // A tensor missing.
      t.erase("out");
      break;
  }
  const uint64_t executor = GetWorkspaceSize(&main_, request, nullptr, e);
  if (executor != 0) DestroyExecutor(&main_, executor, V());
}

// A workspace too small or missing: refused without consuming the
// executor, which then runs with the right one.
void Client::SmallWorkspace() {
  SessionState* s = &main_;
  const int64_t n = 256;
  const uint64_t b = Malloc(s, 4 * n * 2 + 64);
  if (b == 0) return;
  v1::GetWorkspaceSizeRequest request;
  request.set_op("DropoutBackward");
  request.mutable_params()->set_scale(2);
  auto& t = *request.mutable_tensors();
  t["gradOutput"] = Desc(b, v1::FLOAT, {n});
  t["mask"] = Desc(b, v1::UINT8, {32}, {2}, 0, 4 * n);
  t["out"] = Desc(b, v1::FLOAT, {n}, {}, 0, 4 * n + 64);
  uint64_t workspace = 0;
  const uint64_t executor = GetWorkspaceSize(s, request, &workspace, V());
  if (executor == 0) return;
  if (workspace == 0) {
    stats_->Problem("workspace_size", "a strided mask needs a workspace");
    return;
  }
  const uint64_t ws = Malloc(s, workspace);
  if (ws == 0) return;
  switch (Rand(3)) {
    case 0:
      Execute(s, LaunchRequest(s, executor, 0, ws, 0, workspace - 1),
              Invalid("small_workspace", Bit(StatusCode::INVALID_ARGUMENT)));
      break;
    case 1:
      Execute(s, LaunchRequest(s, executor, 0, 1ull << 60, 0, workspace),
              Invalid("small_workspace", Bit(StatusCode::NOT_FOUND)));
      break;
    default:
      Execute(s, LaunchRequest(s, executor, 0, ws, 8, workspace),
              Invalid("bad_range", Bit(StatusCode::INVALID_ARGUMENT)));
      break;
  }
  Execute(s, LaunchRequest(s, executor, 0, ws, 0, workspace), V());
  Sync(s, 0);
  Free(s, ws);
  Free(s, b);
}

// CreateStream until the limit (16 per session) refuses one.
void Client::StreamLimit() {
  SessionState* s = &main_;
  std::vector<uint64_t> made;
  bool refused = false;
  for (int i = 0; i < 20 && !refused; ++i) {
    uint64_t stream = CreateStream(
        s, Invalid("stream_limit",
                   Bit(StatusCode::OK) | Bit(StatusCode::RESOURCE_EXHAUSTED)));
    if (stream == 0) {
      refused = true;
    } else {
      made.push_back(stream);
    }
  }
  if (!refused) {
    stats_->Problem("stream_limit", "20 streams created in one session");
  }
  for (uint64_t stream : made) DestroyStream(s, stream, V());
}

// One ExecuteStream call mixing valid launches with bad ones: each reply
// carries its own outcome and the call goes on.
void Client::MixedPipeline() {
  SessionState* s = &main_;
  const uint64_t b = AnyBuffer(64);
  if (b == 0) return;
  std::vector<v1::ExecuteRequest> launches;
  std::vector<Expect> expects;
  for (int i = 0; i < 6; ++i) {
    if (Chance(0.5)) {
      const uint64_t executor =
          GetWorkspaceSize(s, TinyThreshold(b), nullptr, V());
      if (executor == 0) return;
      launches.push_back(LaunchRequest(s, executor, 0));
      expects.push_back(V());
      if (Chance(0.3)) {  // The same single-use executor again.
        launches.push_back(LaunchRequest(s, executor, 0));
        expects.push_back(
            Invalid("consumed_executor", Bit(StatusCode::FAILED_PRECONDITION)));
      }
    } else if (Chance(0.5)) {
      launches.push_back(LaunchRequest(s, (1ull << 60) + i, 0));
      expects.push_back(Invalid("unknown_handle", Bit(StatusCode::NOT_FOUND)));
    } else {
      const uint64_t executor =
          GetWorkspaceSize(s, TinyThreshold(b), nullptr, V());
      if (executor == 0) return;
      launches.push_back(LaunchRequest(s, executor, (1ull << 60) + i));
      expects.push_back(Invalid("unknown_handle", Bit(StatusCode::NOT_FOUND)));
      // Refused before consuming: destroy it afterwards.
      launches.push_back(LaunchRequest(s, executor, 0));
      expects.push_back(V());
    }
  }
  ExecuteStream(s, launches, expects, V());
  Sync(s, 0);
}

}  // namespace opserver::soak::rpc
