// Writes the fuzzers' seed corpora: a handful of valid requests per target,
// serialized as the server receives them (tensor_view_fuzzer's in its own
// byte format). Run from the workspace root:
//   bazel run //fuzz:make_seeds -- "$PWD/fuzz/corpus"
// The files are committed; rerun this only when the requests change.

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "fuzz/pipeline_seeds.h"
#include "fuzz/seed_files.h"
#include "proto/opserver.pb.h"

namespace {

using namespace opserver::v1;
using opserver::seeds::Desc;
using opserver::seeds::Write;

void WorkspaceSeeds() {
  const std::string f = "workspace_fuzzer";
  // Buffers (fuzz/workspace_fuzzer.cc): 1: 0 B, 2: 1 B, 3: 16 B, 4: 64 B,
  // 5: 256 B, 6: 4096 B, 7: 65600 B.
  GetWorkspaceSizeRequest r;
  r.set_op("ThresholdBackward");
  r.mutable_params()->set_threshold(1.0);
  (*r.mutable_tensors())["gradOutput"] = Desc(3, FLOAT, {4});
  (*r.mutable_tensors())["self"] = Desc(4, FLOAT, {4});
  (*r.mutable_tensors())["out"] = Desc(5, FLOAT, {4});
  Write(f, "threshold_float", r.SerializeAsString());

  // Broadcast [2,1] x [1,3] into a strided out with an offset.
  r.Clear();
  r.set_op("aclnnThresholdBackward");
  r.mutable_params()->set_threshold(0.5);
  (*r.mutable_tensors())["gradOutput"] = Desc(3, INT8, {2, 1});
  (*r.mutable_tensors())["self"] = Desc(3, INT8, {1, 3}, {}, 2);
  (*r.mutable_tensors())["out"] = Desc(6, INT8, {2, 3}, {8, 2}, 1, 3);
  Write(f, "threshold_int8_broadcast_strided", r.SerializeAsString());

  r.Clear();
  r.set_op("SoftshrinkBackward");
  r.mutable_params()->set_lambd(0.5);
  (*r.mutable_tensors())["gradOutput"] = Desc(4, FLOAT16, {2, 4});
  (*r.mutable_tensors())["self"] = Desc(4, FLOAT, {4}, {}, 0, 32);
  TensorDesc out = Desc(5, FLOAT, {2, 4});
  out.add_storage_shape(4);
  out.add_storage_shape(4);
  (*r.mutable_tensors())["gradInput"] = out;
  Write(f, "softshrink_mixed_storage_shape", r.SerializeAsString());

  r.Clear();
  r.set_op("HardswishBackward");
  (*r.mutable_tensors())["gradOutput"] = Desc(6, BF16, {3, 5}, {10, 2});
  (*r.mutable_tensors())["self"] = Desc(6, BF16, {3, 5}, {1, 3}, 100);
  (*r.mutable_tensors())["out"] = Desc(6, BF16, {3, 5}, {}, 1000);
  Write(f, "hardswish_bf16_transposed", r.SerializeAsString());

  r.Clear();
  r.set_op("LeakyReluBackward");
  r.mutable_params()->mutable_negative_slope()->set_dtype(INT32);
  r.mutable_params()->mutable_negative_slope()->set_value(2);
  r.mutable_params()->set_self_is_result(true);
  (*r.mutable_tensors())["gradOutput"] = Desc(5, DOUBLE, {8});
  (*r.mutable_tensors())["self"] = Desc(5, FLOAT, {1});
  (*r.mutable_tensors())["out"] = Desc(6, FLOAT16, {8});
  Write(f, "leaky_relu_int_slope_promoted", r.SerializeAsString());

  // A mask that is not contiguous: gathered into the workspace.
  r.Clear();
  r.set_op("DropoutBackward");
  r.mutable_params()->set_scale(2.0);
  (*r.mutable_tensors())["gradOutput"] = Desc(6, FLOAT, {200});
  (*r.mutable_tensors())["mask"] = Desc(5, UINT8, {32}, {2});
  (*r.mutable_tensors())["out"] = Desc(6, DOUBLE, {200}, {}, 256);
  Write(f, "dropout_strided_mask_workspace", r.SerializeAsString());

  // Large enough to be split over the pool's threads.
  r.Clear();
  r.set_op("ThresholdBackward");
  (*r.mutable_tensors())["gradOutput"] = Desc(6, UINT8, {1});
  (*r.mutable_tensors())["self"] = Desc(7, UINT8, {256, 256});
  (*r.mutable_tensors())["out"] = Desc(7, UINT8, {256, 256}, {256, 1}, 64);
  Write(f, "threshold_uint8_parallel", r.SerializeAsString());

  // Empty tensors and a zero-byte buffer.
  r.Clear();
  r.set_op("HardswishBackward");
  (*r.mutable_tensors())["gradOutput"] = Desc(1, FLOAT, {0, 3});
  (*r.mutable_tensors())["self"] = Desc(1, FLOAT, {0, 3});
  (*r.mutable_tensors())["out"] = Desc(2, FLOAT, {0, 3});
  Write(f, "hardswish_empty", r.SerializeAsString());
}

ValueTensor Values(DataType dtype, std::vector<int64_t> shape,
                   std::vector<double> values) {
  ValueTensor t;
  t.set_dtype(dtype);
  for (int64_t v : shape) t.add_shape(v);
  for (double v : values) t.add_values(v);
  return t;
}

void EvaluateSeeds() {
  const std::string f = "evaluate_fuzzer";
  EvaluateRequest r;
  // The example in docs/by-hand.md.
  r.set_op("ThresholdBackward");
  r.mutable_params()->set_threshold(1.0);
  (*r.mutable_inputs())["gradOutput"] =
      Values(FLOAT, {4}, {4.5, 4.4, 4.3, 4.2});
  (*r.mutable_inputs())["self"] = Values(FLOAT, {4}, {0.2, 1.2, 2.2, 3.2});
  *r.mutable_output() = Values(FLOAT, {4}, {});
  Write(f, "threshold_readme", r.SerializeAsString());

  r.Clear();
  r.set_op("SoftshrinkBackward");
  r.mutable_params()->set_lambd(0.5);
  (*r.mutable_inputs())["gradOutput"] = Values(FLOAT16, {2, 1}, {1, -2});
  (*r.mutable_inputs())["self"] = Values(BF16, {3}, {0.1, -0.7, 3});
  *r.mutable_output() = Values(FLOAT, {2, 3}, {});
  Write(f, "softshrink_broadcast", r.SerializeAsString());

  r.Clear();
  r.set_op("HardswishBackward");
  (*r.mutable_inputs())["gradOutput"] = Values(FLOAT16, {5}, {1, 1, 1, 1, 1});
  (*r.mutable_inputs())["self"] = Values(FLOAT16, {5}, {-4, -3, 0, 3, 4});
  *r.mutable_output() = Values(FLOAT16, {5}, {});
  Write(f, "hardswish_half", r.SerializeAsString());

  r.Clear();
  r.set_op("LeakyReluBackward");
  r.mutable_params()->mutable_negative_slope()->set_dtype(DOUBLE);
  r.mutable_params()->mutable_negative_slope()->set_value(0.01);
  (*r.mutable_inputs())["gradOutput"] = Values(DOUBLE, {2}, {3, 4});
  (*r.mutable_inputs())["self"] = Values(FLOAT, {2}, {-1, 1});
  *r.mutable_output() = Values(DOUBLE, {2}, {});
  Write(f, "leaky_relu_double", r.SerializeAsString());

  r.Clear();
  r.set_op("DropoutBackward");
  r.mutable_params()->set_scale(2);
  (*r.mutable_inputs())["gradOutput"] =
      Values(FLOAT, {4, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  std::vector<double> mask(16, 0);
  mask[0] = 42;
  (*r.mutable_inputs())["mask"] = Values(UINT8, {16}, mask);
  *r.mutable_output() = Values(FLOAT, {4, 2}, {});
  Write(f, "dropout_readme", r.SerializeAsString());
}

void ValuesSeeds() {
  const std::string f = "values_fuzzer";
  WriteValuesRequest w;
  w.set_buffer(1);
  w.set_dtype(FLOAT);
  for (double v : {4.5, 4.4, 4.3, 4.2}) w.add_values(v);
  Write(f, "write_float", w.SerializeAsString());

  w.Clear();
  w.set_dtype(FLOAT16);
  w.set_offset(4090);
  for (double v : {65504.0, -0.0, 1e-8}) w.add_values(v);
  Write(f, "write_half_at_end", w.SerializeAsString());

  w.Clear();
  w.set_dtype(INT64);
  for (double v : {-9223372036854775808.0, 9007199254740993.0, 0.0}) {
    w.add_values(v);
  }
  Write(f, "write_int64_extremes", w.SerializeAsString());

  w.Clear();
  w.set_dtype(BOOL);
  for (double v : {1.0, 0.0, 1.0}) w.add_values(v);
  Write(f, "write_bool", w.SerializeAsString());

  ReadValuesRequest r;
  r.set_dtype(BF16);
  r.set_offset(8);
  r.set_count(100);
  Write(f, "read_bf16", r.SerializeAsString());

  // Both at once: field 5 as values (write) and as count (read).
  w.Clear();
  w.set_dtype(UINT16);
  w.set_offset(2);
  for (double v : {1.0, 65535.0}) w.add_values(v);
  r.Clear();
  r.set_count(2);
  Write(f, "write_and_read_uint16",
        w.SerializeAsString() + r.SerializeAsString());
}

void UploadSeeds() {
  const std::string f = "upload_fuzzer";
  // Buffer 1 of 4096 bytes (fuzz/upload_fuzzer.cc).
  UploadRequest h;
  h.set_session("s");
  h.set_buffer(1);
  h.set_offset(8);
  h.set_size(4);
  h.set_data(std::string("\x00\x00\x80\x3f", 4));
  Write(f, "header_with_data", h.SerializeAsString());

  // Header, then a data message: split at the middle by the fuzzer.
  UploadRequest header;
  header.set_buffer(1);
  header.set_size(20);
  header.set_stream(0);
  UploadRequest data;
  data.set_data(std::string(20 - 0, 'x'));
  std::string first = header.SerializeAsString();
  std::string second = data.SerializeAsString();
  // Pad the header with an unknown field so both halves are whole messages.
  while (first.size() < second.size()) {
    first += std::string("\x38\x00", 2);  // Field 7, varint 0: skipped.
  }
  Write(f, "header_then_data", first + second);

  // Two data fields in one message.
  h.Clear();
  h.set_buffer(1);
  h.set_size(6);
  std::string two = h.SerializeAsString();
  data.set_data("abc");
  two += data.SerializeAsString() + data.SerializeAsString();
  Write(f, "two_data_fields", two);

  // A data length of 2^31 after a header.
  h.Clear();
  h.set_buffer(1);
  h.set_size(16);
  Write(f, "finding1_two_gib_length",
        h.SerializeAsString() + std::string("\x32\x80\x80\x80\x80\x08\x78", 7));
}

// tensor_view_fuzzer's format (fuzz/tensor_view_fuzzer.cc, Decode).
struct ViewBytes {
  std::string bytes;
  void Byte(uint8_t b) { bytes.push_back(static_cast<char>(b)); }
  void Value(int64_t v) {
    if (v >= 0 && v < 256) {
      Byte(0);
      Byte(static_cast<uint8_t>(v));
      return;
    }
    Byte(2);
    for (int i = 0; i < 8; ++i)
      Byte(static_cast<uint8_t>(uint64_t(v) >> (8 * i)));
  }
};

std::string View(int dtype_index, std::vector<int64_t> shape, int strides_mode,
                 std::vector<int64_t> strides, int64_t offset,
                 std::vector<int64_t> storage, int64_t available) {
  ViewBytes b;
  b.Byte(dtype_index);
  b.Byte(shape.size());
  b.Byte(strides_mode);
  for (int64_t v : shape) b.Value(v);
  if (strides_mode == 3) b.Byte(1);
  for (int64_t v : strides) b.Value(v);
  b.Value(offset);
  b.Byte(storage.empty() ? 15 : storage.size());
  for (int64_t v : storage) b.Value(v);
  b.Value(available);
  return b.bytes;
}

void TensorViewSeeds() {
  const std::string f = "tensor_view_fuzzer";
  // dtype index 0 is FLOAT, 1 FLOAT16, 4 UINT8, 10 DOUBLE.
  Write(f, "float_contiguous", View(0, {2, 3}, 0, {}, 0, {}, 24));
  Write(f, "half_strided_offset", View(1, {3, 4}, 1, {8, 2}, 5, {}, 64));
  Write(f, "uint8_storage_shape", View(4, {4, 4}, 1, {1, 4}, 0, {4, 4}, 16));
  Write(f, "double_transposed", View(10, {2, 2, 2}, 1, {1, 4, 2}, 0, {}, 64));
  Write(f, "broadcast_stride0", View(0, {1000000, 3}, 1, {0, 1}, 0, {}, 12));
  Write(f, "huge_stride_overflow",
        View(0, {3, 2}, 1, {int64_t{1} << 62, 1}, 0, {}, 4096));
  Write(f, "strides_count_mismatch", View(0, {2, 2}, 3, {1, 2, 3}, 0, {}, 64));
  Write(f, "empty_with_huge_dims",
        View(0, {0, int64_t{1} << 40}, 1, {1, 1}, 0, {}, 0));
}

}  // namespace

// What a server lists, as the client's op_catalog_fuzzer reads it: two real
// entries and one it must refuse.
void OpCatalogSeeds() {
  const std::string f = "op_catalog_fuzzer";
  ListOperatorsResponse r;
  auto tensor = [](OperatorInfo* op, const char* name, const char* role,
                   std::initializer_list<DataType> dtypes) {
    TensorArgInfo* t = op->add_tensors();
    t->set_name(name);
    t->set_role(role);
    for (DataType d : dtypes) t->add_dtypes(d);
  };
  OperatorInfo* leaky = r.add_operators();
  leaky->set_name("LeakyReluBackward");
  leaky->set_aclnn_name("aclnnLeakyReluBackward");
  tensor(leaky, "gradOutput", "input", {FLOAT, FLOAT16, BF16, DOUBLE});
  tensor(leaky, "self", "input", {FLOAT, FLOAT16, BF16, DOUBLE});
  tensor(leaky, "out", "output", {FLOAT, FLOAT16, BF16, DOUBLE});
  ParamInfo* slope = leaky->add_params();
  slope->set_name("negative_slope");
  slope->set_aclnn_name("negativeSlope");
  slope->set_type("scalar");
  slope->set_default_value(0.01);
  slope->add_dtypes(FLOAT);
  slope->add_dtypes(INT32);
  ParamInfo* result = leaky->add_params();
  result->set_name("self_is_result");
  result->set_aclnn_name("selfIsResult");
  result->set_type("bool");
  result->set_default_value(0);
  OperatorInfo* dropout = r.add_operators();
  dropout->set_name("DropoutBackward");
  dropout->set_aclnn_name("aclnnDropoutBackward");
  tensor(dropout, "gradOutput", "input", {FLOAT, FLOAT16, BF16});
  tensor(dropout, "mask", "input", {UINT8});
  tensor(dropout, "out", "output", {FLOAT, FLOAT16, BF16, DOUBLE});
  ParamInfo* scale = dropout->add_params();
  scale->set_name("scale");
  scale->set_aclnn_name("scale");
  scale->set_type("double");
  scale->set_default_value(2);
  Write(f, "two_ops", r.SerializeAsString());

  OperatorInfo* odd = r.add_operators();
  odd->set_name("Odd");
  tensor(odd, "x", "input", {FLOAT});
  tensor(odd, "dtype", "output", {FLOAT});
  Write(f, "two_ops_and_a_clash", r.SerializeAsString());
}

// data_listener_fuzzer's scripts (its header comment gives the format):
// limits, tickets, then steps; 0 connect, 1 send, 2 close, 3 sleep,
// 4 forget (9: keep a handed-over connection; 19, 29: refuse, expect a
// ticket the client chose).
void DataListenerSeeds() {
  const std::string f = "data_listener_fuzzer";
  auto bytes = [](std::initializer_list<int> values) {
    std::string out;
    for (int v : values) out.push_back(static_cast<char>(v));
    return out;
  };
  // One connection sends its whole ticket at once.
  Write(f, "whole_ticket", bytes({0x09, 0, 0, 1, 0, 0, 15}));
  // The second of two tickets in two pieces, 2 ms apart.
  Write(f, "ticket_in_pieces",
        bytes({0x09, 1, 0, 1, 0, 4, 4, 3, 2, 1, 0, 4, 10}));
  // Silent connections past both limits, then the last one's ticket.
  Write(f, "flood_then_ticket", bytes({0x00, 0, 0, 0, 0, 0, 1, 3, 0, 15}));
  // A flipped byte, a forgotten ticket, and a reset.
  Write(f, "wrong_byte_and_forget",
        bytes({0x12, 2, 0, 1, 0, 2, 15, 0, 1, 1, 8, 15, 4, 1, 12, 0}));
  // Raw bytes, then a valid ticket on another connection.
  Write(f, "raw_bytes",
        bytes({0x3F, 0, 0, 1, 0, 3, 3, 'A', 'B', 'C', 'D', 0, 1, 1, 0, 15}));
  // The first of two tickets claims the connection, which is given back
  // and then sent the second ticket.
  Write(f, "kept_then_next_ticket",
        bytes({0x09, 1, 0, 1, 0, 0, 15, 3, 1, 9, 0, 1, 0, 4, 15}));
  // A ticket the client chose, sent on a kept connection before it is
  // expected (parked 2 ms), then expected; and the same refused.
  Write(f, "client_ticket_parked_then_expected",
        bytes({0x09, 3, 0, 1, 0, 0, 15, 9, 0, 1, 0, 4, 15, 3, 2, 29, 0}));
  Write(f, "client_ticket_parked_then_refused",
        bytes({0x09, 3, 0, 1, 0, 0, 15, 9, 0, 1, 0, 4, 15, 3, 2, 19, 0}));
}

// server_replies_fuzzer's own byte format (fuzz/server_replies_fuzzer.cc).
void ServerRepliesSeeds() {
  const std::string f = "server_replies_fuzzer";
  // Download chunks: mode 0, flags (bit 7: 3 GiB of room; bits 0-5: piece
  // size), room, offset, then the message.
  auto chunk = [](uint8_t flags, uint8_t room, uint8_t at,
                  const std::string& message) {
    return std::string{'\0', static_cast<char>(flags), static_cast<char>(room),
                       static_cast<char>(at)} +
           message;
  };
  DownloadResponse response;
  response.set_data("hello, client");
  Write(f, "download_chunk", chunk(0, 32, 3, response.SerializeAsString()));
  std::string two = response.SerializeAsString();
  response.set_data("bye");
  two += response.SerializeAsString() + std::string("\x48\x2a", 2);
  Write(f, "download_two_data_fields_in_pieces", chunk(5, 20, 0, two));
  // A tag in 6 bytes, which protobuf's parser refuses (a smoke run's
  // finding: the parser took it, dropping the high bits).
  Write(f, "download_six_byte_tag",
        chunk(0, 0, 0,
              std::string("\x79yyyyyyyy\x90\x90\x90\x90\x90\x03\x62", 16)));
  // The third review, finding 1: a length of 2^31 with 3 GiB of room.
  Write(
      f, "finding1_two_gib_length",
      chunk(0x80, 0, 0,
            std::string("\x0a\x80\x80\x80\x80\x08", 6) + std::string(64, 'A')));

  // Pipeline scripts: mode 1, then ops (fuzz/server_replies_fuzzer.cc):
  // 0 await a fence (8: a read of the next byte's size), 1 other commands,
  // 2 take (10: forget) the fence the next byte names, 3 withdraw the last,
  // 4 an event (two length bytes, then a PipelineEvent).
  auto event =
      [](uint64_t acknowledged,
         std::initializer_list<std::pair<uint64_t, std::string>> results) {
        PipelineEvent e;
        e.set_acknowledged(acknowledged);
        for (const auto& [id, data] : results) {
          FenceResult* r = e.add_fences();
          r->set_id(id);
          r->set_data(data);
        }
        const std::string bytes = e.SerializeAsString();
        return std::string{'\4', static_cast<char>(bytes.size() & 0xff),
                           static_cast<char>(bytes.size() >> 8)} +
               bytes;
      };
  const std::string fences_and_read =
      std::string{'\1', '\0', '\1', '\2', '\x08', '\4'} + event(0, {}) +
      event(4, {{1, ""}, {2, "read"}}) + std::string{'\2', '\1', '\2', '\2'};
  Write(f, "fences_and_a_read", fences_and_read);
  // The third review, finding 2: results already taken, sent again.
  Write(f, "finding2_replayed_results",
        fences_and_read + event(4, {{1, ""}, {2, "read"}}));
  Write(f, "forgotten_read_then_withdrawn",
        std::string{'\1', '\x08', '\3', '\x0a', '\1'} + event(1, {{1, "abc"}}) +
            std::string{'\0', '\3'} + event(1, {{1, "abc"}}));
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_ROOT\n");
    return 2;
  }
  opserver::seeds::SetRoot(argv[1]);
  WorkspaceSeeds();
  EvaluateSeeds();
  ValuesSeeds();
  UploadSeeds();
  TensorViewSeeds();
  opserver::seeds::PipelineSeeds();
  OpCatalogSeeds();
  DataListenerSeeds();
  ServerRepliesSeeds();
  return 0;
}
