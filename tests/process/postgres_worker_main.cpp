// main() of the PostgreSQL process tests' executable: run as `<binary> --postgres-worker COMMAND
// ...` it is a worker (postgres_worker.hpp), otherwise it runs its tests. One per executable,
// apart from the test files linked into it.
#include "postgres_worker.hpp"

IDEM_POSTGRES_WORKER_MAIN()
