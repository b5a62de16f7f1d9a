#include "runtime/pipeline_batch.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "google/protobuf/wire_format_lite.h"

namespace opserver {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

constexpr int kCommandsField = v1::PipelineRequest::kCommandsFieldNumber;

absl::Status Malformed() {
  return absl::InvalidArgumentError(
      "a Pipeline batch that is not a PipelineRequest");
}

// The next top-level field of `in`: a command's bytes (in `command`, true
// returned through `is_command`) or any other field, skipped and, when
// `others` is not null, appended to it as it was on the wire. False at the
// end (`in` read `size` bytes from `base`); Malformed() on bytes that are
// not a field.
absl::StatusOr<bool> NextField(CodedInputStream& in, const char* base, int size,
                               bool* is_command, absl::string_view* command,
                               std::string* others) {
  const int start = in.CurrentPosition();
  if (start == size) return false;
  const uint32_t tag = in.ReadTag();
  if (tag == 0) return Malformed();  // 0, or cut short.
  if (WireFormatLite::GetTagFieldNumber(tag) == kCommandsField &&
      WireFormatLite::GetTagWireType(tag) ==
          WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
    uint32_t length = 0;
    if (!in.ReadVarint32(&length)) return Malformed();
    const int at = in.CurrentPosition();
    if (!in.Skip(static_cast<int>(length))) return Malformed();
    *is_command = true;
    *command = absl::string_view(base + at, length);
    return true;
  }
  // A field the parser would keep (the session) or store as unknown: kept
  // as it was, for the whole request's own parse to judge.
  if (!WireFormatLite::SkipField(&in, tag)) return Malformed();
  if (others != nullptr) {
    others->append(base + start, in.CurrentPosition() - start);
  }
  *is_command = false;
  return true;
}

}  // namespace

absl::StatusOr<PipelineBatch> PipelineBatch::Open(std::string wire,
                                                  size_t max_commands) {
  if (wire.size() > static_cast<size_t>(INT32_MAX)) return Malformed();
  PipelineBatch batch;
  batch.wire_ = std::move(wire);
  // One pass over the top level: the commands are counted and skipped,
  // every other field is parsed as a PipelineRequest of its own (which
  // checks the session name is UTF-8, as a whole parse would).
  CodedInputStream in(reinterpret_cast<const uint8_t*>(batch.wire_.data()),
                      static_cast<int>(batch.wire_.size()));
  std::string others;
  for (;;) {
    bool is_command = false;
    absl::string_view command;
    ASSIGN_OR_RETURN(bool more, NextField(in, batch.wire_.data(),
                                          static_cast<int>(batch.wire_.size()),
                                          &is_command, &command, &others));
    if (!more) break;
    if (is_command) ++batch.size_;
  }
  v1::PipelineRequest head;
  if (!head.ParseFromString(others)) return Malformed();
  if (batch.size_ > max_commands) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a Pipeline batch of ", batch.size_,
                     " commands is over the limit of ", max_commands,
                     " (--max_pipeline_batch_commands): send smaller batches"));
  }
  batch.session_ = head.session();
  return batch;
}

absl::StatusOr<PipelineBatch::Progress> PipelineBatch::ApplyNext(
    CommandPipeline& pipeline, Session& session, size_t max,
    const CommandPipeline::Resume& resume) {
  // Parsed here, dropped on return: only this slice is ever parsed.
  google::protobuf::RepeatedPtrField<v1::PipelineCommand> commands;
  std::vector<size_t> ends;  // Where in wire_ each parsed command ends.
  const char* const base = wire_.data() + offset_;
  const int size = static_cast<int>(wire_.size() - offset_);
  CodedInputStream in(reinterpret_cast<const uint8_t*>(base), size);
  while (static_cast<size_t>(commands.size()) < max &&
         applied_ + commands.size() < size_) {
    bool is_command = false;
    absl::string_view bytes;
    ASSIGN_OR_RETURN(bool more,
                     NextField(in, base, size, &is_command, &bytes, nullptr));
    if (!more) break;  // Not reached: Open counted the commands.
    if (!is_command) continue;
    if (!commands.Add()->ParseFromArray(bytes.data(),
                                        static_cast<int>(bytes.size()))) {
      return Malformed();
    }
    ends.push_back(offset_ + in.CurrentPosition());
  }
  const size_t next =
      pipeline.Apply(session, commands, 0, commands.size(), resume);
  Progress progress;
  progress.applied = next;
  for (size_t i = 0; i < next; ++i) {
    if (commands[static_cast<int>(i)].has_fence()) ++progress.fences;
  }
  applied_ += next;
  if (next > 0) offset_ = ends[next - 1];
  return progress;
}

uint64_t PipelineBatch::held_bytes() const {
  return wire_.capacity() + session_.capacity();
}

}  // namespace opserver
