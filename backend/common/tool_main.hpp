// The outer frame of every backend executable's main(): runs the tool and turns what escapes it
// into an exit status, the same way in every tool. A common::Error is a user error (bad flag,
// bad file, a check that refused): its message is logged as an error and the status is 2.
// Anything else is a bug: logged as "internal error (please report)", status 3. std::cout is
// flushed first, so a tool's own output already under way (the arguments dump, Megatron's
// iteration lines) is never cut by the message.
#pragma once

#include <functional>

namespace common {

// `body` returns the tool's exit status. On an exception, `on_failure(status)` (when given)
// runs and its return value becomes the exit status: pretrain_gpt aborts its MPI job there,
// because the other ranks may wait in a collective for this one.
int run_tool(const std::function<int()>& body,
             const std::function<int(int)>& on_failure = nullptr);

}  // namespace common
