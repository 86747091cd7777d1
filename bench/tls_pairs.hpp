// How the TLS benchmarks (postgres_tls_bench.cpp, redis_tls_bench.cpp) register a case: once in
// plaintext (tls:0) and once over TLS (tls:1), in real time, so that the ratio of a pair is what
// TLS costs.
#pragma once

#include <benchmark/benchmark.h>

namespace idem::bench {

// The most threads a TLS case runs on; the benchmark's pools have as many connections.
constexpr int kTlsMaxThreads = 4;

// tls:0 and tls:1.
inline void tls_pair(benchmark::internal::Benchmark* b) {
  b->ArgName("tls")->Arg(0)->Arg(1)->UseRealTime();
}

// tls:0 and tls:1, each on one thread and on kTlsMaxThreads.
inline void tls_pair_on_threads(benchmark::internal::Benchmark* b) {
  b->ArgName("tls")->Arg(0)->Arg(1)->Threads(1)->Threads(kTlsMaxThreads)->UseRealTime();
}

}  // namespace idem::bench
