#!/usr/bin/env python3
"""Prints medians from Google Benchmark JSON files and the ratios idem's targets are stated in.

Usage: bench/report.py bench/results/sqlite_recorder [more ...]   (".json" is added)
Every ratio compares two figures measured in the same run on the same machine.
"""
import json
import os
import statistics
import sys

from ratios import record


def entries(paths):
    """Every benchmark entry of the JSON files that exist among `paths` (".json" is added)."""
    for path in paths:
        if not path.endswith(".json"):
            path += ".json"
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            continue
        yield from data["benchmarks"]


def load_repetitions(paths):
    """Each benchmark's single repetitions (in the file when aggregates are only displayed)."""
    runs = {}
    for b in entries(paths):
        if b.get("run_type") == "iteration":
            runs.setdefault(b["run_name"], []).append(
                {"rate": b.get("items_per_second"), "handover_ns": b.get("handover_ns")})
    return runs


def load(paths):
    medians = {}
    for b in entries(paths):
        if b.get("aggregate_name") == "median":
            name = b["run_name"]
            medians[name] = {
                "ns": b["real_time"] if b.get("time_unit", "ns") == "ns" else None,
                "time": b["real_time"],
                "unit": b.get("time_unit", "ns"),
                "rate": b.get("items_per_second"),
            }
    return medians


def fmt_rate(rate):
    if rate is None:
        return "-"
    if rate >= 1e6:
        return f"{rate / 1e6:.2f} M/s"
    if rate >= 1e3:
        return f"{rate / 1e3:.1f} k/s"
    return f"{rate:.0f} /s"


def command_for(paths, name):
    """The bench/run.sh command that measures `name` (a results file among `paths`) again."""
    reps = os.environ.get("IDEM_BENCH_REPETITIONS")
    return (f"IDEM_BENCH_REPETITIONS={reps} " if reps else "") + f"bench/run.sh {name}"


SHAPES = {"hex32": "32-hex ids", "uuid36": "UUID ids", "text": "short text ids (<= 16 bytes)",
          "text26": "26-byte text ids", "text255": "255-byte text ids"}


def main(argv):
    medians = load(argv[1:])
    repetitions = load_repetitions(argv[1:])
    if not medians:
        print("no results", file=sys.stderr)
        return 1
    print(f"{'benchmark (median)':<62} {'time':>12} {'rate':>12}")
    for name, m in medians.items():
        print(f"{name:<62} {m['time']:>9.1f} {m['unit']:<2} {fmt_rate(m['rate']):>12}")

    def rate(name):
        m = medians.get(name)
        return m["rate"] if m else None

    def time(name):
        m = medians.get(name)
        return m["time"] if m else None

    ratios = []
    for full in (0, 1):
        r_idem = rate(f"BM_SqliteRecorder_CheckMark/full:{full}/real_time")
        r_raw = rate(f"BM_RawSqlite_CheckMark/full:{full}/real_time")
        if r_idem and r_raw:
            label = f"SQLite recorder check+mark / raw sqlite3 loop (synchronous={'FULL' if full else 'NORMAL'})"
            ratios.append((label, r_idem / r_raw, "target >= 0.50"))
            record(label, r_idem / r_raw, 0.50, f"idem {fmt_rate(r_idem)}, raw {fmt_rate(r_raw)}",
                   face="consumer", group="SQLite recorder: check + mark / raw sqlite3 loop",
                   bar=f"synchronous={'FULL' if full else 'NORMAL'}, 1 thread",
                   command=command_for(argv[1:], "sqlite_recorder"))
        r_idem8 = rate(f"BM_SqliteRecorder_Marks/full:{full}/real_time/threads:8")
        r_raw8 = rate(f"BM_RawSqlite_Marks/full:{full}/real_time/threads:8")
        if r_idem8 and r_raw8:
            ratios.append((f"sqlite recorder 8-thread marks / raw 8 connections (synchronous={'FULL' if full else 'NORMAL'})",
                           r_idem8 / r_raw8, f"idem {fmt_rate(r_idem8)}; target >= 40 k/s"))
    for full in (0, 1):
        r_store = rate(f"BM_SqliteStore_ClaimComplete/full:{full}/real_time")
        r_raw = rate(f"BM_RawSqliteStore_ClaimComplete/full:{full}/real_time")
        if r_store and r_raw:
            durability = "FULL" if full else "NORMAL"
            label = f"SQLite store claim+complete / raw sqlite3 loop (synchronous={durability})"
            ratios.append((label, r_store / r_raw, "target >= 0.50"))
            record(label, r_store / r_raw, 0.50, f"store {fmt_rate(r_store)}, raw {fmt_rate(r_raw)}",
                   face="operation", group="SQLite store: claim + complete / raw sqlite3 loop",
                   bar=f"synchronous={durability}, 1 thread",
                   command=command_for(argv[1:], "sqlite_store"))
    shapes = ["hex32", "uuid36", "text", "text255", "text26"]
    for i, shape in enumerate(shapes):
        one = rate(f"BM_MemoryRecorder_CheckMark/shape:{i}/iterations:1000000/real_time/threads:1")
        two = rate(f"BM_MemoryRecorder_CheckMark/shape:{i}/iterations:500000/real_time/threads:2")
        ref = rate(f"BM_UnorderedSet_CheckMark/shape:{i}/iterations:1000000/real_time")
        if one and ref:
            ratios.append((f"memory check+mark, new {shape} ids, 1 M held / unordered_set with reserve",
                           one / ref, f"idem {fmt_rate(one)}, set {fmt_rate(ref)}; target >= 2, >= 5 M/s"))
            record(f"memory recorder check+mark / reserved unordered_set ({shape} ids)", one / ref, 2.0,
                   f"idem {fmt_rate(one)}, set {fmt_rate(ref)}", face="consumer",
                   group="memory recorder: check + mark of a new id, 1 M held / "
                         "std::unordered_set with reserve",
                   bar=SHAPES.get(shape, shape), command=command_for(argv[1:], "memory_recorder"))
        if one and two:
            ratios.append((f"memory check+mark, new {shape} ids, 2 threads / 1 thread", two / one,
                           f"{fmt_rate(two)}; target >= 1.7"))
            # The host moves the two virtual CPUs: each 2-thread run measured what a cache line
            # took between them (handover_ns) right after its timed loop. Group the runs by it.
            name = f"BM_MemoryRecorder_CheckMark/shape:{i}/iterations:500000/real_time/threads:2"
            runs = repetitions.get(name, [])
            for label, near in (("< 100 ns", True), (">= 100 ns", False)):
                rates = [r["rate"] for r in runs
                         if r["handover_ns"] is not None and (r["handover_ns"] < 100) == near]
                if rates:
                    ratios.append((f"  same, runs where a line moved in {label}",
                                   statistics.median(rates) / one, f"{len(rates)} of {len(runs)} runs"))
        ids = time(f"BM_ShapedIds/shape:{i}")
        if ids is not None:
            ratios.append((f"the benchmark making one {shape} id (ns; part of each row above)", ids, ""))
        checked = rate(f"BM_MemoryRecorder_CheckProcessed/shape:{i}")
        if checked:
            ratios.append((f"memory check of a processed {shape} id (M/s)", checked / 1e6, "target >= 20"))
    one = rate("BM_SharedTableCeiling/iterations:1000000/real_time/threads:1")
    two = rate("BM_SharedTableCeiling/iterations:500000/real_time/threads:2")
    if one and two:
        ratios.append(("lock-free shared-table traffic, 2 threads / 1 thread (the 2-thread ceiling)",
                       two / one, f"{fmt_rate(two)}"))
    handover = time("BM_CacheLineRoundTrip/iterations:1000000/real_time/threads:2")
    if handover is not None:
        ratios.append(("one cache line's move between the two threads' cores (ns)", handover, ""))
    counters = {b["run_name"]: b for b in entries(argv[1:])
                if b.get("aggregate_name") == "median" and "server_us" in b}
    get = counters.get("BM_RawGet/real_time")
    setnx = counters.get("BM_RawSetNx/real_time")
    replay = counters.get("BM_RedisStore_Replay/real_time")
    new_key = counters.get("BM_RedisStore_NewKey/real_time")
    if get and replay:
        ratios.append(("redis store replay: server usec per call / plain GET",
                       replay["server_us"] / get["server_us"],
                       f"{replay['server_us']:.2f} vs {get['server_us']:.2f} us; target <= 1.5"))
        ratios.append(("redis store replay, sequential: calls/s / raw GET",
                       replay["items_per_second"] / get["items_per_second"], "target >= 0.8"))
    if setnx and new_key:
        ratios.append(("redis store new key claim+complete: server usec / SET NX EX",
                       new_key["server_us"] / setnx["server_us"],
                       f"{new_key['server_us']:.2f} vs {setnx['server_us']:.2f} us; target <= 3"))
        ratios.append(("redis store new key, sequential: calls/s / raw SET NX EX",
                       new_key["items_per_second"] / setnx["items_per_second"], "target >= 0.45"))
    direct = time("BM_DirectCall")
    plain = time("BM_ResilientNoPolicies")
    if direct is not None and plain is not None:
        ratios.append(("resilient() overhead over a direct call (ns)", plain - direct, "target <= 300 ns"))
    replay = time("BM_ResilientReplay")
    if replay is not None:
        ratios.append(("replay from the memory store (ns, median)", replay, "target <= 1000 ns"))
    if ratios:
        print()
        for label, value, note in ratios:
            print(f"{label:<86} {value:>10.2f}   {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
