// The raw-RPC client's invalid requests that name handles and sessions
// not the caller's to use: made-up and empty sessions, other
// sessions' buffers, executors and streams, handles nobody made, a freed
// buffer and a consumed executor (InvalidScenario in
// soak_invalid_scenarios.cc picks among them).

#include <cstdint>
#include <string>

#include "bench/soak_rpc_client.h"

namespace opserver::soak::rpc {

// A made-up or empty session, on any RPC.
void Client::BadSession() {
  const bool empty = Rand(3) == 0;
  SessionState fake;
  fake.token = empty ? "" : RandomToken();
  const Expect e = empty ? Invalid("empty_session", kInvalid | kNotFound)
                         : Invalid("bad_session", kNotFound);
  AnyRpcOn(&fake, e);
}

// Another session's buffer.
void Client::ForeignBuffer() {
  SessionState* s = &main_;
  // Made first: a new handle could otherwise take the foreign number.
  const uint64_t mine = AnyBuffer();
  const uint64_t h = ForeignHandle('b');
  if (h == 0 || mine == 0) return;
  const Expect e = Invalid("foreign_handle", kNotFound);
  std::string bytes;
  switch (Rand(5)) {
    case 0:
      Free(s, h, e);
      break;
    case 1:
      Download(s, h, 0, 1, 0, &bytes, e);
      break;
    case 2:
      ReadValues(s, h, 0, v1::UINT8, 1, 0, nullptr, e);
      break;
    case 3:
      Upload(s, h, 0, "x", 0, 1, e);
      break;
    default: {
      v1::GetWorkspaceSizeRequest request = TinyThreshold(mine);
      (*request.mutable_tensors())["self"].set_buffer(h);
      GetWorkspaceSize(s, request, nullptr, e);
      break;
    }
  }
}

// Another session's executor.
void Client::ForeignExecutor() {
  SessionState* s = &main_;
  const uint64_t h = ForeignHandle('e');
  if (h == 0) return;
  switch (Rand(3)) {
    case 0:
      Execute(s, LaunchRequest(s, h, 0),
              Invalid("foreign_handle", kNotFound | kPrecondition));
      break;
    case 1:
      SetRepeatable(s, h, Invalid("foreign_handle", kNotFound));
      break;
    default:
      DestroyExecutor(s, h, Invalid("foreign_handle", kNotFound));
      break;
  }
}

// Another session's stream.
void Client::ForeignStream() {
  SessionState* s = &main_;
  const Expect e = Invalid("foreign_handle", kNotFound);
  switch (Rand(3)) {
    case 0:
    case 1: {
      const uint64_t h = ForeignHandle('s');
      if (h == 0) return;
      if (Chance(0.5)) {
        Sync(s, h, e);
      } else {
        DestroyStream(s, h, e);
      }
      break;
    }
    default: {
      // A valid executor on a stream that is not ours: refused before
      // the executor is consumed, so it still launches afterwards.
      uint64_t mine = AnyBuffer();
      if (mine == 0) return;
      uint64_t executor =
          GetWorkspaceSize(s, TinyThreshold(mine), nullptr, V());
      const uint64_t h = ForeignHandle('s');
      if (executor == 0 || h == 0) return;
      Execute(s, LaunchRequest(s, executor, h), e);
      Execute(s, LaunchRequest(s, executor, 0), V());
      break;
    }
  }
}

// Handles nobody made.
void Client::UnknownHandle() {
  SessionState* s = &main_;
  const uint64_t h = (1ull << 60) + Rand(1000);
  const Expect e = Invalid("unknown_handle", kNotFound);
  switch (Rand(4)) {
    case 0:
      Free(s, h, e);
      break;
    case 1:
      Sync(s, h, e);
      break;
    case 2:
      Execute(s, LaunchRequest(s, h, 0), e);
      break;
    default:
      DestroyExecutor(s, h, e);
      break;
  }
}

// A freed buffer.
void Client::FreedBuffer() {
  SessionState* s = &main_;
  const uint64_t b = Malloc(s, 64);
  if (b == 0 || !Free(s, b)) return;
  const Expect e = Invalid("freed_buffer", kNotFound);
  if (Chance(0.5)) {
    Free(s, b, e);
  } else {
    WriteValues(s, b, 0, v1::FLOAT, {1}, 0, e);
  }
}

// A consumed executor.
void Client::ConsumedExecutor() {
  SessionState* s = &main_;
  uint64_t mine = AnyBuffer();
  if (mine == 0) return;
  uint64_t executor = GetWorkspaceSize(s, TinyThreshold(mine), nullptr, V());
  if (executor == 0 || !Execute(s, LaunchRequest(s, executor, 0), V()).ok()) {
    return;
  }
  switch (Rand(3)) {
    case 0:
      Execute(s, LaunchRequest(s, executor, 0),
              Invalid("consumed_executor", kPrecondition));
      break;
    case 1:
      DestroyExecutor(s, executor, Invalid("consumed_executor", kNotFound));
      break;
    default:
      SetRepeatable(s, executor, Invalid("consumed_executor", kNotFound));
      break;
  }
}

// One RPC, chosen at random, naming `fake` (a made-up or empty session).
void Client::AnyRpcOn(SessionState* fake, const Expect& e) {
  std::string bytes;
  switch (Rand(16)) {
    case 0:
      Malloc(fake, 16, e);
      break;
    case 1:
      Free(fake, 1, e);
      break;
    case 2:
      CreateStream(fake, e);
      break;
    case 3:
      DestroyStream(fake, 1, e);
      break;
    case 4:
      Sync(fake, 0, e);
      break;
    case 5:
      Upload(fake, 1, 0, "abcd", 0, 4, e);
      break;
    case 6:
      Download(fake, 1, 0, 4, 0, &bytes, e);
      break;
    case 7:
      WriteValues(fake, 1, 0, v1::FLOAT, {1}, 0, e);
      break;
    case 8:
      ReadValues(fake, 1, 0, v1::FLOAT, 1, 0, nullptr, e);
      break;
    case 9:
      GetWorkspaceSize(fake, TinyThreshold(1), nullptr, e);
      break;
    case 10:
      Execute(fake, LaunchRequest(fake, 1, 0), e);
      break;
    case 11:
      SetRepeatable(fake, 1, e);
      break;
    case 12:
      DestroyExecutor(fake, 1, e);
      break;
    case 13: {
      v1::GetSessionStatsRequest request;
      request.set_session(fake->token);
      v1::SessionStats stats;
      Unary("GetSessionStats", SOAK_RT(GetSessionStats), request, &stats, e);
      break;
    }
    case 14: {
      grpc::ClientContext context;
      SetDeadline(&context, kCallDeadline);
      v1::AttachRequest request;
      request.set_session(fake->token);
      auto reader = conn_->rt->Attach(&context, request);
      v1::AttachEvent event;
      bool attached = false;
      while (reader->Read(&event)) attached = true;
      Outcome o = Record("Attach", e, reader->Finish(), context);
      if (attached && mode_ == Mode::kSoak) {
        stats_->Problem("attach_fake", "an unknown session was attached");
      }
      (void)o;
      break;
    }
    default: {
      v1::CloseSessionRequest request;
      request.set_session(fake->token);
      v1::CloseSessionResponse response;
      Unary("CloseSession", SOAK_RT(CloseSession), request, &response, e);
      break;
    }
  }
}

}  // namespace opserver::soak::rpc
