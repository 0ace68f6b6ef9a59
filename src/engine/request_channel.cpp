// Finish reasons' names and the caller's side of a request channel (RequestHandle).
#include "engine/request_channel.h"

namespace dsv41 {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    default:
      return "none";
  }
}

uint64_t RequestHandle::id() const {
  return ch_->id();
}
bool RequestHandle::next(RequestOutput& out, std::chrono::milliseconds timeout) {
  return ch_->next(out, timeout);
}
void RequestHandle::cancel() {
  ch_->cancel();
}

}  // namespace dsv41
