// A copy that runs on a thread of its own while its caller goes on: the
// bytes of Session::UploadAsync and DownloadAsync, moved after the server
// has ordered the transfer on its stream. PendingRead holds one and waits
// for it.
#ifndef OPSERVER_CLIENT_BACKGROUND_COPY_H_
#define OPSERVER_CLIENT_BACKGROUND_COPY_H_

#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace opserver {
namespace remote {

class BackgroundCopy {
 public:
  // Runs `run` on a new thread; RESOURCE_EXHAUSTED when none can be
  // started (then `run` never runs). `cancel` must make a running `run`
  // return soon; it may be called from any thread, before, during or after
  // `run`, and more than once.
  static absl::StatusOr<std::unique_ptr<BackgroundCopy>> Start(
      std::function<absl::Status()> run, std::function<void()> cancel);

  BackgroundCopy(const BackgroundCopy&) = delete;
  BackgroundCopy& operator=(const BackgroundCopy&) = delete;
  // Cancels a copy still running and waits for its thread: nothing it
  // touches is used after this returns.
  ~BackgroundCopy();

  // Waits until `run` returned; its status.
  absl::Status Wait();
  // `cancel` (see Start), unless `run` has returned.
  void Cancel();

 private:
  BackgroundCopy(std::function<absl::Status()> run,
                 std::function<void()> cancel)
      : run_(std::move(run)), cancel_(std::move(cancel)) {}

  std::function<absl::Status()> run_;
  const std::function<void()> cancel_;
  std::thread thread_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace remote
}  // namespace opserver

#endif  // OPSERVER_CLIENT_BACKGROUND_COPY_H_
