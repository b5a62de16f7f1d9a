// One Pipeline batch (a serialized PipelineRequest) as the channel holds it
// while CommandPipeline applies it, a slice at a time, without the
// transport.
//
// A batch can wait for as long as its client likes: at a fence while the
// client does not read its fence results, at a launch or write while its
// stream is full. What it holds meanwhile must be bounded by what was
// admitted, --max_pipeline_batch_bytes of wire bytes. A parsed batch is
// not: packed repeated fields expand when parsed (a TensorDesc.shape of
// zeros is 1 byte a value on the wire and 8 parsed, so a 3.7 MiB batch
// held 31 MiB: the third review, finding 5), and every command becomes a
// message of its own. So a batch keeps only its wire bytes; each slice is
// parsed from them when it runs and dropped before it returns, and a batch
// that stops keeps no parsed command, only where to go on from. Validating
// commands before a batch may wait would not do: a valid batch of many
// small commands also parses to several times its size.
#ifndef OPSERVER_RUNTIME_PIPELINE_BATCH_H_
#define OPSERVER_RUNTIME_PIPELINE_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/command_pipeline.h"
#include "runtime/session.h"

namespace opserver {

class PipelineBatch {
 public:
  // `wire`, checked to be a PipelineRequest of at most `max_commands`
  // commands (the commands themselves are parsed when applied): otherwise
  // INVALID_ARGUMENT or RESOURCE_EXHAUSTED, as the channel reports them.
  static absl::StatusOr<PipelineBatch> Open(std::string wire,
                                            size_t max_commands);

  // The request's session field.
  const std::string& session() const { return session_; }
  // Commands in the batch, and how many were applied so far.
  size_t size() const { return size_; }
  size_t applied() const { return applied_; }
  bool done() const { return applied_ == size_; }

  struct Progress {
    size_t applied = 0;  // Commands applied by this call.
    size_t fences = 0;   // Of which fences.
  };
  // Parses up to `max` of the commands not applied yet and applies them
  // in order to `session` with `pipeline`, which may stop early (see
  // CommandPipeline::Apply; `resume` says when to call again). The parsed
  // commands are gone when it returns. A command that does not parse is
  // INVALID_ARGUMENT, and none of this call's commands is applied.
  absl::StatusOr<Progress> ApplyNext(CommandPipeline& pipeline,
                                     Session& session, size_t max,
                                     const CommandPipeline::Resume& resume);

  // Bytes the batch holds between calls to ApplyNext (its wire bytes and
  // session name): what a waiting channel holds for its batch.
  uint64_t held_bytes() const;

 private:
  PipelineBatch() = default;

  std::string wire_;
  std::string session_;
  size_t size_ = 0;
  size_t applied_ = 0;
  // Where in wire_ the commands not applied yet start (top-level fields
  // between them are skipped again).
  size_t offset_ = 0;
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_PIPELINE_BATCH_H_
