// PurgeProgress: how long-running purges report how far they got.
//
// Recorders (IdempotencyRecorder::purge) and stores (IdempotencyStore::purge_expired) delete in
// bounded chunks, so that a large store never holds one huge transaction or lock, and call the
// callback between chunks with the running total of what they deleted. An operator tool shows it
// as progress; a maintenance job may log it.
//
// Guarantees: the callback runs on the purging thread, outside every lock and transaction of the
// backend; it is called only after a chunk that deleted something, with a total that never
// decreases, the last call carrying the total the purge returns. An empty callback is allowed.
// An exception thrown by the callback stops the purge and propagates (the chunks already
// committed stay deleted).
//
// Thread-safety: the callback is called from the thread that called the purge, one call at a
// time.
#pragma once

#include <cstddef>
#include <functional>

namespace idem {

using PurgeProgress = std::function<void(std::size_t done_so_far)>;

}  // namespace idem
