#include "fuzz/pipeline_seeds.h"

#include <cstdint>
#include <string>
#include <utility>

#include "fuzz/seed_files.h"
#include "proto/opserver.pb.h"

namespace opserver::seeds {
namespace {

using namespace opserver::v1;

constexpr char kFuzzer[] = "pipeline_fuzzer";
// Buffers 1..7 of 0, 1, 16, 64, 256, 4096 and 65600 bytes, stream 8
// (fuzz/pipeline_fuzzer.cc). Client executor ids start at 2^62.
constexpr uint64_t kId = uint64_t{1} << 62;

void Plan(PipelineRequest& r, uint64_t executor, const char* op,
          TensorDesc grad, TensorDesc self, const char* self_name,
          TensorDesc out, const char* out_name) {
  PlanCommand* p = r.add_commands()->mutable_plan();
  p->set_executor(executor);
  p->mutable_request()->set_op(op);
  p->mutable_request()->mutable_params()->set_threshold(0.5);
  p->mutable_request()->mutable_params()->set_scale(2);
  (*p->mutable_request()->mutable_tensors())["gradOutput"] = grad;
  (*p->mutable_request()->mutable_tensors())[self_name] = self;
  (*p->mutable_request()->mutable_tensors())[out_name] = out;
}

void Launch(PipelineRequest& r, uint64_t executor, uint64_t stream,
            uint64_t workspace = 0, uint64_t size = 0) {
  ExecuteRequest* l = r.add_commands()->mutable_launch();
  l->set_executor(executor);
  l->set_stream(stream);
  l->set_workspace_buffer(workspace);
  l->set_workspace_size(size);
}

void Fence(PipelineRequest& r, uint64_t fence_id, uint64_t stream,
           bool session) {
  FenceCommand* c = r.add_commands()->mutable_fence();
  c->set_id(fence_id);
  c->set_stream(stream);
  c->set_session(session);
}

void WriteCmd(PipelineRequest& r, uint64_t buffer, uint64_t offset,
              std::string data, uint64_t stream) {
  WriteCommand* w = r.add_commands()->mutable_write();
  w->set_buffer(buffer);
  w->set_offset(offset);
  w->set_data(std::move(data));
  w->set_stream(stream);
}

void Read(PipelineRequest& r, uint64_t fence_id, uint64_t buffer,
          uint64_t offset, uint64_t size, uint64_t stream) {
  FenceCommand* c = r.add_commands()->mutable_fence();
  c->set_id(fence_id);
  c->set_stream(stream);
  c->set_read_buffer(buffer);
  c->set_read_offset(offset);
  c->set_read_size(size);
}

void CreateEvent(PipelineRequest& r, uint64_t event, uint32_t flags) {
  CreateEventCommand* c = r.add_commands()->mutable_create_event();
  c->set_event(event);
  c->set_flags(flags);
}

void EventFence(PipelineRequest& r, uint64_t fence_id, uint64_t event) {
  FenceCommand* c = r.add_commands()->mutable_fence();
  c->set_id(fence_id);
  c->set_event(event);
}

void PlanLaunchFence() {
  const uint64_t id = kId;
  PipelineRequest r;
  Plan(r, id, "ThresholdBackward", Desc(6, FLOAT, {64}), Desc(6, FLOAT, {64}),
       "self", Desc(5, FLOAT, {64}), "out");
  Plan(r, id + 1, "ThresholdBackward", Desc(6, FLOAT, {1024}),
       Desc(6, FLOAT, {1024}), "self", Desc(6, FLOAT, {1024}), "out");
  Launch(r, id, 0);
  Launch(r, id + 1, 8);
  Fence(r, 1, 0, false);
  Fence(r, 2, 8, false);
  Fence(r, 3, 0, true);
  Write(kFuzzer, "plan_launch_fence", r.SerializeAsString());
}

// A strided mask gathered into a workspace, launched with and without it.
void DropoutWorkspaceRepeatable() {
  const uint64_t id = kId;
  PipelineRequest r;
  Plan(r, id, "DropoutBackward", Desc(7, FLOAT, {128}),
       Desc(7, UINT8, {16}, {2}), "mask", Desc(7, FLOAT, {128}), "out");
  r.add_commands()->set_set_executor_repeatable(id);
  Launch(r, id, 0);
  Launch(r, id, 8, 6, 4096);
  Fence(r, 1, 0, false);
  r.add_commands()->set_destroy_executor(id);
  Fence(r, 2, 8, false);
  Write(kFuzzer, "dropout_workspace_repeatable", r.SerializeAsString());
}

// Frees under queued work, a full stream, unknown handles.
void FullStreamFreesUnknown() {
  const uint64_t id = kId;
  PipelineRequest r;
  Plan(r, id, "HardswishBackward", Desc(7, FLOAT, {16384}),
       Desc(7, FLOAT, {16384}), "self", Desc(7, FLOAT, {16384}), "out");
  r.add_commands()->set_set_executor_repeatable(id);
  for (int i = 0; i < 40; ++i) Launch(r, id, 8);
  r.add_commands()->set_free(7);
  r.add_commands()->set_free(7);
  r.add_commands()->set_destroy_executor(id + 9);
  Launch(r, id + 3, 0);
  for (uint64_t i = 1; i <= 6; ++i) Fence(r, i, i % 2 == 0 ? 8 : 0, i > 4);
  Write(kFuzzer, "full_stream_frees_unknown", r.SerializeAsString());
}

// A refused plan whose op name the driver grows to 1 MiB, launched, then
// the whole batch repeated 300 times (the driver's "repeat:" session).
void HugeNameRepeatedBatch() {
  const uint64_t id = kId;
  PipelineRequest r;
  r.set_session("repeat:300");
  Plan(r, id, "*huge", Desc(6, FLOAT, {64}), Desc(6, FLOAT, {64}), "self",
       Desc(5, FLOAT, {64}), "out");
  Launch(r, id, 0);
  r.add_commands()->set_free(99);
  Fence(r, 1, 0, true);
  Write(kFuzzer, "huge_name_repeated_batch", r.SerializeAsString());
}

// Writes and read fences around a launch; one write and one read out of
// range, one read over the 1 MiB limit, and the batch repeated so that
// held writes and reads reach their budgets.
void WritesAndReads() {
  const uint64_t id = kId;
  PipelineRequest r;
  r.set_session("repeat:40");
  WriteCmd(r, 5, 0, std::string(256, '\x3f'), 0);
  WriteCmd(r, 7, 0, std::string(65600, '\x01'), 8);
  Plan(r, id, "ThresholdBackward", Desc(5, FLOAT, {64}), Desc(5, FLOAT, {64}),
       "self", Desc(4, FLOAT, {16}), "out");
  Launch(r, id, 0);
  Read(r, 1, 4, 0, 64, 0);
  Read(r, 2, 7, 0, 65600, 8);
  WriteCmd(r, 3, 8, std::string(16, '\x02'), 0);
  Read(r, 3, 3, 8, 16, 0);
  Read(r, 4, 2, 0, (1 << 20) + 1, 0);
  Fence(r, 5, 0, true);
  Write(kFuzzer, "writes_and_reads", r.SerializeAsString());
}

// Memsets and device copies: in range, out of range, overlapping.
void MemsetsAndCopies(PipelineRequest& r) {
  MemsetRequest* memset = r.add_commands()->mutable_memset();
  memset->set_buffer(6);
  memset->set_offset(16);
  memset->set_size(64);
  memset->set_value(0x5a);
  memset->set_stream(8);
  memset = r.add_commands()->mutable_memset();
  memset->set_buffer(4);
  memset->set_offset(60);
  memset->set_size(8);
  CopyDeviceToDeviceRequest* copy = r.add_commands()->mutable_copy();
  copy->set_dst_buffer(7);
  copy->set_src_buffer(6);
  copy->set_size(4096);
  copy->set_stream(8);
  copy = r.add_commands()->mutable_copy();
  copy->set_dst_buffer(6);
  copy->set_dst_offset(8);
  copy->set_src_buffer(6);
  copy->set_size(256);
}

// Events across the two streams, memsets and device copies, an event id
// reused and one below 2^62, a wait on an unknown event, event fences, and
// the batch repeated so that records and waits pile up on a held stream.
void EventsMemsetCopy() {
  const uint64_t id = kId;
  PipelineRequest r;
  r.set_session("repeat:40");
  CreateEvent(r, id + 100, 0);
  CreateEvent(r, id + 100, 0x8);
  CreateEvent(r, 5, 0x1);
  CreateEvent(r, id + 101, 0x4);
  Plan(r, id + 102, "ThresholdBackward", Desc(7, FLOAT, {16384}),
       Desc(7, FLOAT, {16384}), "self", Desc(7, FLOAT, {16384}), "out");
  Launch(r, id + 102, 0);
  RecordEventRequest* record = r.add_commands()->mutable_record_event();
  record->set_event(id + 100);
  StreamWaitEventRequest* wait = r.add_commands()->mutable_wait_event();
  wait->set_stream(8);
  wait->set_event(id + 100);
  wait = r.add_commands()->mutable_wait_event();
  wait->set_stream(8);
  wait->set_event(id + 999);
  MemsetsAndCopies(r);
  EventFence(r, 1, id + 100);
  ResetEventRequest* reset = r.add_commands()->mutable_reset_event();
  reset->set_event(id + 100);
  reset->set_stream(8);
  EventFence(r, 2, id + 100);
  EventFence(r, 3, id + 999);
  r.add_commands()->set_destroy_event(id + 100);
  r.add_commands()->set_destroy_event(id + 100);
  Fence(r, 4, 8, false);
  Fence(r, 5, 0, true);
  Write(kFuzzer, "events_memset_copy", r.SerializeAsString());
}

// Data transfers (the data path's stand-in takes them): in range on both
// streams, outside their buffer, an unknown buffer and stream, a bad
// ticket and direction, and cancels, known and not.
void DataTransfers() {
  PipelineRequest r;
  auto transfer = [&](uint64_t buffer, uint64_t offset, uint64_t size,
                      uint64_t stream, int direction, std::string ticket) {
    v1::DataTransferCommand& t = *r.add_commands()->mutable_data_transfer();
    t.set_buffer(buffer);
    t.set_offset(offset);
    t.set_size(size);
    t.set_stream(stream);
    t.set_direction(
        static_cast<v1::OpenDataTransferRequest::Direction>(direction));
    t.set_ticket(std::move(ticket));
  };
  const std::string ticket(16, 't');
  transfer(6, 0, 4096, 0, 1, ticket);
  transfer(7, 64, 65536, 8, 2, std::string(16, 'u'));
  transfer(7, 65, 65536, 0, 1, std::string(16, 'v'));
  transfer(99, 0, 1, 0, 1, std::string(16, 'w'));
  transfer(6, 0, 1, 42, 2, std::string(16, 'x'));
  transfer(6, 0, 1, 0, 2, "short");
  transfer(6, 0, 1, 0, 0, std::string(16, 'y'));
  r.add_commands()->set_cancel_data_transfer(ticket);
  r.add_commands()->set_cancel_data_transfer("unknown");
  Fence(r, 1, 0, false);
  Fence(r, 2, 8, false);
  Fence(r, 3, 0, true);
  Write(kFuzzer, "data_transfers", r.SerializeAsString());
}

}  // namespace

void PipelineSeeds() {
  DataTransfers();
  PlanLaunchFence();
  DropoutWorkspaceRepeatable();
  FullStreamFreesUnknown();
  HugeNameRepeatedBatch();
  WritesAndReads();
  EventsMemsetCopy();
}

}  // namespace opserver::seeds
