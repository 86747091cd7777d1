// Where the demo writes in its store, and how it takes all of it away again.
//
// Without --store the recorder is idem.db in the work dir, the demo's alone (consumers "billing"
// and "shipping", ledger table idem_demo_ledger); it goes with the work dir.
//
// With --store URL the demo first looks at the store without changing anything and refuses it
// (InvalidArgument, so exit 2, naming what is there) when it already holds data — unless
// --allow-nonempty-store. It then writes only under a namespace named after its run
// ("idem-demo-" and 8 hex digits), removed by remove() at the end:
//   sqlite:      a file that did not exist is the demo's: it is deleted with its -wal, -shm,
//                -journal and -outbox.lock. In an existing file (--allow-nonempty-store) the demo
//                uses consumers "<run>.billing" / "<run>.shipping" and a ledger table
//                "idem_demo_<hex>_ledger", and deletes their markers, claims, outbox rows and
//                the table.
//   postgresql:  a schema of its own, "idem_demo_<hex>" (the URL's schema= is replaced), dropped
//                with everything in it (DROP SCHEMA ... CASCADE).
//   redis:       a key prefix of its own, the URL's prefix followed by "<run>:", whose keys are
//                deleted (SCAN, then UNLINK).
// A run with a store or a broker names its consumers "<run>.billing" and "<run>.shipping", so
// runs against one server or broker never see each other's markers or messages.
//
// Thread-safety: one thread.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "../demo.hpp"
#include "idem/recorder.hpp"

namespace idem::cli::demo {

class StoreNamespace {
 public:
  // Decides where the demo writes; writes nothing. `run` is the run's name ("idem-demo-<hex>").
  // Throws InvalidArgument for a store that holds data (without options.allow_nonempty_store),
  // the backend's errors when it cannot be looked at.
  StoreNamespace(const DemoOptions& options, std::string run);
  // Without --store: the recorder is idem.db in `work_dir` (NotSupported in a build without
  // SQLite). Does nothing with --store.
  void place_default(const std::filesystem::path& work_dir);

  // The URL the demo's processes open (the namespace applied).
  const std::string& url() const noexcept { return url_; }
  // "" for the default store, else the run's name.
  const std::string& run() const noexcept { return run_; }
  // "billing" or "<run>.billing" (role "billing" or "shipping").
  std::string consumer(const std::string& role) const;
  // The ledger table on `recorder` (ledger.hpp).
  std::string ledger(const IdempotencyRecorder& recorder) const;

  // Removes everything the demo wrote under its namespace, then closes `recorder` (reset): a
  // store file the demo made is deleted after it is closed. Reports a failure on stderr (naming
  // what is left) instead of throwing. Does nothing for the default store.
  void remove(std::shared_ptr<IdempotencyRecorder>& recorder) noexcept;

  // What --keep leaves in the store and how to look at it, one line each ("" for the default
  // store).
  std::string kept() const;

 private:
  enum class Kind {
    work_dir,
    new_sqlite_file,
    shared_sqlite_file,
    postgres_schema,
    redis_prefix,
    other
  };
  Kind kind_ = Kind::work_dir;
  std::string run_;
  std::string url_;
  std::string sqlite_path_;  // new_sqlite_file
  std::string schema_;       // postgres_schema
  std::string prefix_;       // redis_prefix
};

// `url` with the query parameter `name` set to `value` (replacing one the URL has).
std::string with_query_parameter(const std::string& url, const std::string& name,
                                 const std::string& value);

}  // namespace idem::cli::demo
