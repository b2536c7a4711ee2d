#include "core/base/results.hpp"

namespace fastpar {

const char * finish_reason_name(FinishReason reason) {
    switch (reason) {
        case FinishReason::Stop: return "stop";
        case FinishReason::Length: return "length";
        case FinishReason::Error: return "error";
        case FinishReason::Cancelled: return "cancelled";
        case FinishReason::ToolCalls: return "tool_calls";
    }
    return "error";
}

}  // namespace fastpar
