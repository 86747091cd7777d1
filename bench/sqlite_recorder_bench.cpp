// The SQLite recorder against a raw sqlite3 loop doing the same statements at the same
// durability (WAL, synchronous=NORMAL unless the benchmark says FULL), measured in one run.
//
//   *_CheckMark      one thread: SELECT 1 ... ; INSERT OR IGNORE ... (autocommit), a new event
//                    each iteration
//   *_CheckMarkWindow/batch  a window of 64 new events: a check and a mark per event (batch:0), or
//                    one is_processed_many and one mark_processed_many (batch:1)
//   BM_RawSqlite_Lookup64/how  64 lookups (half of them markers) in a table of 100,000: 64
//                    autocommit SELECTs (0), the same 64 inside one BEGIN..COMMIT (1), or one
//                    SELECT ... IN (64 ids) (2) — how is_processed_many should read
//   *_Marks/threads  N threads marking concurrently; every mark returns after its commit. The
//                    recorder groups concurrent marks into shared transactions; the raw baseline
//                    is one connection per thread committing each mark.
#include <benchmark/benchmark.h>
#include <sqlite3.h>

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "bench_ids.hpp"
#include "idem/clock.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "recorder_window.hpp"
#include "sqlite_bench_db.hpp"

namespace {

using idem::bench::remove_db;

std::string fresh_db_path() {
  return idem::bench::fresh_db_path("idem-bench");
}

idem::sqlite::Durability durability_of(benchmark::State& state) {
  return state.range(0) == 0 ? idem::sqlite::Durability::normal : idem::sqlite::Durability::full;
}

// ---- raw sqlite3 ----------------------------------------------------------------------------

class RawConnection {
 public:
  RawConnection(const std::string& path, bool full) : db_(path, full) {
    db_.exec(
        "CREATE TABLE IF NOT EXISTS processed_log(consumer TEXT, event_id TEXT, ts TEXT, "
        "PRIMARY KEY(consumer, event_id))");
    select_ = db_.prepare("SELECT 1 FROM processed_log WHERE consumer = ?1 AND event_id = ?2");
    insert_ = db_.prepare(
        "INSERT OR IGNORE INTO processed_log(consumer, event_id, ts) VALUES (?1, ?2, ?3)");
  }

  bool is_processed(std::string_view consumer, std::string_view id) {
    sqlite3_bind_text(select_, 1, consumer.data(), static_cast<int>(consumer.size()),
                      SQLITE_STATIC);
    sqlite3_bind_text(select_, 2, id.data(), static_cast<int>(id.size()), SQLITE_STATIC);
    const bool found = sqlite3_step(select_) == SQLITE_ROW;
    sqlite3_reset(select_);
    return found;
  }
  void mark_processed(std::string_view consumer, std::string_view id) {
    const std::string ts = idem::sqlite::marker_timestamp(std::chrono::system_clock::now());
    sqlite3_bind_text(insert_, 1, consumer.data(), static_cast<int>(consumer.size()),
                      SQLITE_STATIC);
    sqlite3_bind_text(insert_, 2, id.data(), static_cast<int>(id.size()), SQLITE_STATIC);
    sqlite3_bind_text(insert_, 3, ts.data(), static_cast<int>(ts.size()), SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(insert_)) == SQLITE_BUSY)
      sqlite3_reset(insert_);
    sqlite3_reset(insert_);
    if (rc != SQLITE_DONE) throw std::runtime_error(sqlite3_errmsg(db_.get()));
  }

 private:
  idem::bench::RawDb db_;
  sqlite3_stmt* select_ = nullptr;
  sqlite3_stmt* insert_ = nullptr;
};

// One thread checks and marks a new event each iteration, in autocommit.
template <class Marks>
void check_and_mark_new_events(benchmark::State& state, Marks& marks) {
  idem::bench::IdSequence ids(1);
  for (auto _ : state) {
    const std::string_view id = ids.next();
    if (!marks.is_processed("billing", id)) marks.mark_processed("billing", id);
  }
}

void BM_RawSqlite_CheckMark(benchmark::State& state) {
  idem::bench::on_db_file(state, fresh_db_path(), [&](const std::string& path) {
    RawConnection db(path, state.range(0) != 0);
    check_and_mark_new_events(state, db);
  });
}
BENCHMARK(BM_RawSqlite_CheckMark)->Arg(0)->Arg(1)->ArgName("full")->UseRealTime();

void BM_RawSqlite_Lookup64(benchmark::State& state) {
  const std::string path = fresh_db_path();
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  sqlite3_exec(db,
               "PRAGMA journal_mode=WAL; CREATE TABLE processed_log(consumer TEXT, event_id TEXT, "
               "ts TEXT, PRIMARY KEY(consumer, event_id))",
               nullptr, nullptr, nullptr);
  constexpr int kRows = 100000;
  std::vector<std::string> marked;
  {
    idem::bench::IdSequence ids(7);
    sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
    sqlite3_stmt* insert = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO processed_log VALUES ('billing', ?1, 'x')", -1, &insert,
                       nullptr);
    for (int i = 0; i < kRows; ++i) {
      const std::string id(ids.next());
      sqlite3_bind_text(insert, 1, id.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_step(insert);
      sqlite3_reset(insert);
      if (i % 1000 == 0) marked.push_back(id);
    }
    sqlite3_finalize(insert);
    sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
  }
  // 32 markers and 32 unknown ids, interleaved.
  std::vector<std::string> window;
  idem::bench::IdSequence unknown(8);
  for (std::size_t i = 0; i < idem::bench::kWindow / 2; ++i) {
    window.push_back(marked[i]);
    window.emplace_back(unknown.next());
  }
  sqlite3_stmt* single = nullptr;
  sqlite3_prepare_v2(db, "SELECT 1 FROM processed_log WHERE consumer = ?1 AND event_id = ?2", -1,
                     &single, nullptr);
  std::string in_sql = "SELECT event_id FROM processed_log WHERE consumer = ?1 AND event_id IN (";
  for (std::size_t i = 0; i < window.size(); ++i)
    in_sql += (i == 0 ? "?" : ", ?") + std::to_string(i + 2);
  in_sql += ")";
  sqlite3_stmt* in_list = nullptr;
  sqlite3_prepare_v2(db, in_sql.c_str(), -1, &in_list, nullptr);
  const int how = static_cast<int>(state.range(0));
  std::size_t found = 0;
  for (auto _ : state) {
    found = 0;
    if (how == 2) {
      sqlite3_bind_text(in_list, 1, "billing", -1, SQLITE_STATIC);
      for (std::size_t i = 0; i < window.size(); ++i) {
        sqlite3_bind_text(in_list, static_cast<int>(i + 2), window[i].data(),
                          static_cast<int>(window[i].size()), SQLITE_STATIC);
      }
      while (sqlite3_step(in_list) == SQLITE_ROW)
        ++found;
      sqlite3_reset(in_list);
    } else {
      if (how == 1) sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
      for (const std::string& id : window) {
        sqlite3_bind_text(single, 1, "billing", -1, SQLITE_STATIC);
        sqlite3_bind_text(single, 2, id.data(), static_cast<int>(id.size()), SQLITE_STATIC);
        if (sqlite3_step(single) == SQLITE_ROW) ++found;
        sqlite3_reset(single);
      }
      if (how == 1) sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
    }
  }
  if (found != idem::bench::kWindow / 2) state.SkipWithError("wrong number of markers found");
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(window.size()));
  sqlite3_finalize(single);
  sqlite3_finalize(in_list);
  sqlite3_close(db);
  remove_db(path);
}
BENCHMARK(BM_RawSqlite_Lookup64)->Arg(0)->Arg(1)->Arg(2)->ArgName("how");

std::string g_raw_path;
void BM_RawSqlite_Marks(benchmark::State& state) {
  if (state.thread_index() == 0) {
    g_raw_path = fresh_db_path();
    RawConnection init(g_raw_path, state.range(0) != 0);
  }
  std::unique_ptr<RawConnection> db;
  idem::bench::IdSequence ids(static_cast<std::uint64_t>(state.thread_index()) + 1);
  for (auto _ : state) {
    if (!db) {
      state.PauseTiming();
      db = std::make_unique<RawConnection>(g_raw_path, state.range(0) != 0);
      state.ResumeTiming();
    }
    db->mark_processed("billing", ids.next());
  }
  db.reset();
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) remove_db(g_raw_path);
}
BENCHMARK(BM_RawSqlite_Marks)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("full")
    ->Threads(1)
    ->Threads(8)
    ->UseRealTime();

// ---- idem -----------------------------------------------------------------------------------

void BM_SqliteRecorder_CheckMark(benchmark::State& state) {
  idem::bench::on_db_file(state, fresh_db_path(), [&](const std::string& path) {
    idem::sqlite::SqliteOptions options;
    options.durability = durability_of(state);
    idem::sqlite::SqliteIdempotencyRecorder recorder(path, options);
    check_and_mark_new_events(state, recorder);
  });
}
BENCHMARK(BM_SqliteRecorder_CheckMark)->Arg(0)->Arg(1)->ArgName("full")->UseRealTime();

void BM_SqliteRecorder_CheckMarkWindow(benchmark::State& state) {
  const std::string path = fresh_db_path();
  {
    idem::sqlite::SqliteOptions options;
    options.durability = durability_of(state);
    idem::sqlite::SqliteIdempotencyRecorder recorder(path, options);
    idem::bench::IdSequence ids(1);
    idem::bench::check_mark_window(state, recorder, "billing", ids, state.range(1) != 0);
  }
  remove_db(path);
}
BENCHMARK(BM_SqliteRecorder_CheckMarkWindow)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"full", "batch"})
    ->UseRealTime();

std::unique_ptr<idem::sqlite::SqliteIdempotencyRecorder> g_recorder;
std::string g_recorder_path;
void BM_SqliteRecorder_Marks(benchmark::State& state) {
  if (state.thread_index() == 0) {
    g_recorder_path = fresh_db_path();
    idem::sqlite::SqliteOptions options;
    options.durability = durability_of(state);
    g_recorder =
        std::make_unique<idem::sqlite::SqliteIdempotencyRecorder>(g_recorder_path, options);
  }
  idem::bench::IdSequence ids(static_cast<std::uint64_t>(state.thread_index()) + 1);
  for (auto _ : state)
    g_recorder->mark_processed("billing", ids.next());
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    g_recorder.reset();
    remove_db(g_recorder_path);
  }
}
BENCHMARK(BM_SqliteRecorder_Marks)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("full")
    ->Threads(1)
    ->Threads(8)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
