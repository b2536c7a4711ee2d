#include "core/sampling/token_chooser.hpp"

namespace fastpar {

const char * way_name(TokenChooser::Way way) {
    switch (way) {
        case TokenChooser::Way::Pooled:
            return "pooled";
        case TokenChooser::Way::Split:
            return "split";
        case TokenChooser::Way::OneThread:
            break;
    }
    return "one_thread";
}

}  // namespace fastpar
