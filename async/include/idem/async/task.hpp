// The coroutine type of idem's asynchronous face, and what every async call promises.
//
// idem::async::Task<T> is asio::awaitable<T> (standalone Asio, C++20 coroutines): await it from
// an Asio coroutine (`co_await recorder.is_processed(...)`) or start it with asio::co_spawn.
//
// The rules every idem coroutine follows (docs/async.md):
//  * It never blocks the thread that runs it: I/O is non-blocking on the coroutine's executor,
//    or (SQLite, which has no asynchronous I/O) runs on idem's own threads and the coroutine
//    resumes on its executor when the work is done.
//  * It resumes on the executor of the awaiting coroutine, never on an idem thread.
//  * It honours the awaiting coroutine's cancellation slot (asio::bind_cancellation_slot,
//    asio::experimental::awaitable_operators' `||`, a per-attempt timeout): a cancelled call
//    ends with asio::system_error(asio::error::operation_aborted) where it can still stop;
//    a call whose effect may already have happened (a write that reached the server) reports
//    that as the blocking face does (StoreError, in doubt), never as "nothing happened".
//  * String views and references it takes must stay valid until the awaitable completes (like
//    Asio's buffers). Pass named objects: g++ 12 can destroy a temporary created inside a
//    co_await expression (`co_await store.complete(key, t, v, ExecutionReport{}, ttl)`, a
//    lambda turned into a std::function argument) before the coroutine reads it, or twice
//    (GCC bugs 100611 and 101367); a named local in the awaiting coroutine is always safe.
//  * Argument errors (InvalidKey, InvalidArgument) are thrown from the co_await, like every
//    other error, before the backend is reached.
#pragma once

#include <asio/awaitable.hpp>

namespace idem::async {

template <class T = void>
using Task = asio::awaitable<T>;

}  // namespace idem::async
