#!/usr/bin/env python3
"""Checks the histories idem_history_client wrote during one failover-soak run.

    scripts/check_history.py [--mode NAME] [--durable] [--json] FILE_OR_DIR...
    scripts/check_history.py --self-test

Every FILE (or every *.jsonl in a DIR) is one client process's history: one JSON object a line,
as soak/history_client.cpp describes. A call is the pair (p, c): an "invoke" line and at most one
outcome, "ok" or "fail" (with "class" retryable, in_doubt or fatal). "final" lines are the
re-reads after the load; "final_fail" a re-read that never succeeded; "stuck" the watchdog's
last word before it ended a process. Times ("t") are CLOCK_MONOTONIC milliseconds, one clock for
every process, so "A ended before B started" is A's outcome t < B's invoke t. Calls whose
intervals overlap are concurrent: no rule orders them.

Terms. An *acknowledged mark* is a mark call with outcome ok. An *accepted completion* is a
complete call with outcome ok and "accepted": true; its *claim* is the claim call of the same
process and key whose ok granted the completion's token (status acquired). A *grant* is a claim
call with outcome ok and status acquired.

Violations (the exit status is 1 when one is found):

  never ended     An invoke without an outcome: the call hung (the watchdog ended the process)
                  or the process died in it.
  stale token     An accepted completion X (token T, claim CX) while another grant CY of the same
                  key with a token other than T was invoked after CX ended and ended before X was
                  invoked: the key had been claimed anew, so T was fenced off and X had to be
                  refused.
  doubled         Two accepted completions of one key with different tokens. A pair whose later
                  completion's claim was invoked after the earlier completion ended is "doubled
                  after loss": the store had forgotten an acknowledged completion (a lost write)
                  and the key ran again. Such a pair is a violation only with --durable (the
                  loss itself is counted under lost); every other pair is a violation always.
  phantom         A read (claim answered completed, get, final get) returning a completed value
                  that no complete call of that key was ever invoked with.
  lost (--durable only; counted always)
                  An acknowledged mark that a later read did not find: a check invoked after the
                  mark ended answered found=false, or its final check did. An accepted completion
                  whose value a later read did not find: the final get of its key shows another
                  value or no completed record, or a grant of its key was invoked after it ended
                  (the store had no completed record to answer with).

Figures per run: calls (invokes, the final phase excluded), ok, in doubt (fail, class in_doubt),
retryable (fail, class retryable), fatal, never ended, lost (marks + completions), doubled
(keys with more than one accepted completion), stale, phantom, final unread (final_fail).
"""

import argparse
import json
import os
import sys
import tempfile

CONSUMER_OPS = ("mark", "check")
STORE_OPS = ("claim", "complete", "get")


def load(paths):
    lines = []
    files = []
    for path in paths:
        if os.path.isdir(path):
            files.extend(
                os.path.join(path, name) for name in sorted(os.listdir(path)) if name.endswith(".jsonl")
            )
        else:
            files.append(path)
    for name in files:
        with open(name, encoding="utf-8") as f:
            for number, text in enumerate(f, 1):
                text = text.strip()
                if not text:
                    continue
                try:
                    lines.append(json.loads(text))
                except json.JSONDecodeError:
                    # A process killed mid-write leaves a partial last line; anything else is bad.
                    raise SystemExit(f"check_history: {name}:{number}: not JSON: {text[:80]}")
    return lines


class Call:
    __slots__ = ("p", "c", "op", "key", "invoke", "outcome")

    def __init__(self, line):
        self.p = line["p"]
        self.c = line["c"]
        self.op = line["op"]
        self.key = line["key"]
        self.invoke = line
        self.outcome = None

    @property
    def start(self):
        return self.invoke["t"]

    @property
    def end(self):
        return self.outcome["t"] if self.outcome else float("inf")

    def ok(self):
        return self.outcome is not None and self.outcome["phase"] == "ok"


def check(lines, durable):
    calls = {}
    finals = []
    final_fail = 0
    stuck = []
    for line in lines:
        phase = line.get("phase")
        ident = (line.get("p"), line.get("c"))
        if phase == "invoke":
            calls[ident] = Call(line)
        elif phase in ("ok", "fail"):
            call = calls.get(ident)
            if call is None or call.outcome is not None:
                raise SystemExit(f"check_history: outcome without its invoke: {line}")
            call.outcome = line
        elif phase == "final":
            finals.append(line)
        elif phase == "final_fail":
            final_fail += 1
        elif phase == "stuck":
            stuck.append(line)

    figures = {
        "calls": len(calls),
        "ok": 0,
        "in_doubt": 0,
        "retryable": 0,
        "fatal": 0,
        "never_ended": 0,
        "lost": 0,
        "lost_marks": 0,
        "lost_completions": 0,
        "doubled": 0,
        "doubled_after_loss": 0,
        "stale": 0,
        "phantom": 0,
        "final_unread": final_fail,
    }
    violations = []

    for call in calls.values():
        if call.outcome is None:
            figures["never_ended"] += 1
            violations.append(f"never ended: p{call.p} call {call.c} {call.op} {call.key!r} at t={call.start}")
        elif call.outcome["phase"] == "ok":
            figures["ok"] += 1
        else:
            cls = call.outcome.get("class", "fatal")
            figures[cls if cls in ("in_doubt", "retryable") else "fatal"] += 1

    by_op = {}
    for call in calls.values():
        by_op.setdefault(call.op, []).append(call)

    # ---- marks -------------------------------------------------------------------------------
    acked = {}
    for call in by_op.get("mark", []):
        if call.ok():
            acked[call.key] = call
    lost_marks = set()
    for call in by_op.get("check", []):
        mark = acked.get(call.key)
        if mark and call.ok() and call.outcome.get("found") is False and call.start > mark.end:
            lost_marks.add(call.key)
    for line in finals:
        if line["op"] == "check" and line["key"] in acked and line.get("found") is False:
            lost_marks.add(line["key"])
    figures["lost_marks"] = len(lost_marks)

    # ---- completions ---------------------------------------------------------------------------
    grants = {}  # key -> grants (ok claims, status acquired)
    for call in by_op.get("claim", []):
        if call.ok() and call.outcome.get("status") == "acquired":
            grants.setdefault(call.key, []).append(call)
    invoked_values = {}
    for call in by_op.get("complete", []):
        invoked_values.setdefault(call.key, set()).add(call.invoke.get("value"))
    accepted = {}
    for call in by_op.get("complete", []):
        if call.ok() and call.outcome.get("accepted") is True:
            accepted.setdefault(call.key, []).append(call)

    def claim_of(completion):
        token = completion.outcome["token"]
        best = None
        for grant in grants.get(completion.key, []):
            if grant.p == completion.p and grant.outcome.get("token") == token and grant.end <= completion.start:
                best = grant
        return best

    lost_completions = set()
    for key, completions in accepted.items():
        for x in completions:
            cx = claim_of(x)
            token = x.outcome["token"]
            for cy in grants.get(key, []):
                if cy.outcome.get("token") == token:
                    continue
                if cx is not None and cy.start > cx.end and cy.end < x.start:
                    figures["stale"] += 1
                    violations.append(
                        f"stale token: key {key!r}: p{x.p} completed with token {token} at t={x.start} "
                        f"after p{cy.p} was granted token {cy.outcome.get('token')} at t={cy.end}"
                    )
                if cy.start > x.end:
                    lost_completions.add((key, token))
        distinct = {}
        for x in completions:
            distinct.setdefault(x.outcome["token"], x)
        if len(distinct) > 1:
            figures["doubled"] += 1
            ordered = sorted(distinct.values(), key=lambda call: call.end)
            for earlier, later in zip(ordered, ordered[1:]):
                claim = claim_of(later)
                if claim is not None and claim.start > earlier.end:
                    figures["doubled_after_loss"] += 1
                    if durable:
                        violations.append(
                            f"doubled after loss: key {key!r}: tokens {earlier.outcome['token']} and "
                            f"{later.outcome['token']} both accepted"
                        )
                else:
                    violations.append(
                        f"doubled: key {key!r}: tokens {earlier.outcome['token']} (p{earlier.p}) and "
                        f"{later.outcome['token']} (p{later.p}) both accepted"
                    )

    final_gets = {}
    for line in finals:
        if line["op"] == "get":
            final_gets.setdefault(line["key"], []).append(line)
    for key, completions in accepted.items():
        for x in completions:
            for line in final_gets.get(key, []):
                if line.get("state") != "completed" or line.get("value") != x.outcome.get("value"):
                    lost_completions.add((key, x.outcome["token"]))
    figures["lost_completions"] = len(lost_completions)
    figures["lost"] = figures["lost_marks"] + figures["lost_completions"]

    # ---- phantoms ------------------------------------------------------------------------------
    reads = [
        (call.key, call.outcome.get("value"))
        for call in by_op.get("get", [])
        if call.ok() and call.outcome.get("state") == "completed"
    ]
    reads += [(line["key"], line.get("value")) for line in finals if line["op"] == "get" and line.get("state") == "completed"]
    for key, value in reads:
        if value not in invoked_values.get(key, set()):
            figures["phantom"] += 1
            violations.append(f"phantom: key {key!r} read completed with {value!r}, never written")

    if durable and figures["lost"]:
        violations.append(
            f"lost: {figures['lost_marks']} acknowledged marks and {figures['lost_completions']} "
            "accepted completions missing afterwards"
        )
    for line in stuck:
        violations.append(f"stuck: p{line.get('p')} call {line.get('c')} {line.get('op')} ran {line.get('after_ms')} ms")
    return figures, violations


COLUMNS = ("calls", "ok", "in_doubt", "retryable", "fatal", "never_ended", "lost", "doubled", "stale", "phantom", "final_unread")


def print_figures(mode, figures, violations, durable):
    print(f"mode {mode} ({'durable' if durable else 'not durable'}): "
          + ", ".join(f"{name.replace('_', ' ')} {figures[name]}" for name in COLUMNS)
          + f" (lost: {figures['lost_marks']} marks, {figures['lost_completions']} completions;"
          + f" doubled after loss: {figures['doubled_after_loss']})")
    for violation in violations[:50]:
        print(f"  VIOLATION {violation}")
    if len(violations) > 50:
        print(f"  ... {len(violations) - 50} more violations")
    print(f"mode {mode}: {'FAIL' if violations else 'PASS'}")


# ---- self-test -------------------------------------------------------------------------------


class Builder:
    """Writes a synthetic history, one process at a time."""

    def __init__(self):
        self.lines = []
        self.calls = {}

    def call(self, p, op, key, start, end, outcome="ok", invoke_extra=None, **extra):
        c = self.calls[p] = self.calls.get(p, 0) + 1
        self.lines.append(dict(p=p, c=c, op=op, key=key, phase="invoke", t=start, **(invoke_extra or {})))
        if outcome is None:
            return
        line = dict(p=p, c=c, op=op, key=key, phase=outcome, t=end, **extra)
        self.lines.append(line)

    def final(self, p, op, key, **extra):
        self.lines.append(dict(p=p, c=0, op=op, key=key, phase="final", t=10_000, **extra))

    def complete(self, p, key, token, start, end, accepted=True, outcome="ok", **extra):
        value = f"p{p}-t{token}"
        if outcome == "ok":
            extra.update(token=token, value=value, accepted=accepted)
        self.call(p, "complete", key, start, end, outcome, {"token": token, "value": value}, **extra)


def clean():
    b = Builder()
    b.call(1, "mark", "p1-e1", 0, 1)
    b.call(1, "check", "p1-e1", 2, 3, found=True)
    b.call(1, "mark", "p1-e2", 4, 5, outcome="fail", **{"class": "in_doubt"})
    b.call(1, "claim", "k", 0, 1, status="acquired", token=10, took_over=False)
    b.call(2, "claim", "k", 0.5, 1.5, status="in_progress", token=10, took_over=False)
    b.complete(1, "k", 10, 2, 3)
    b.call(2, "claim", "k", 4, 5, status="completed", token=10, took_over=False)
    b.call(2, "get", "k", 6, 7, state="completed", token=10, value="p1-t10")
    # A stalled owner fenced off: p3 took the key over, p1's late completion is refused.
    b.call(1, "claim", "j", 0, 1, status="acquired", token=5, took_over=False)
    b.call(3, "claim", "j", 3000, 3001, status="acquired", token=6, took_over=True)
    b.complete(1, "j", 5, 3002, 3003, accepted=False)
    b.complete(3, "j", 6, 3004, 3005)
    b.final(1, "check", "p1-e1", found=True)
    b.final(1, "check", "p1-e2", found=False)  # in doubt: not a loss
    b.final(1, "get", "k", state="completed", token=10, value="p1-t10")
    b.final(3, "get", "j", state="completed", token=6, value="p3-t6")
    return b


def self_test():
    cases = []

    def case(name, builder, durable, expect_pass, **expect):
        cases.append((name, builder, durable, expect_pass, expect))

    case("clean history passes", clean(), True, True, lost=0, doubled=0)

    b = clean()
    b.call(2, "mark", "p2-e1", 20, None, outcome=None)
    case("a call that never ended fails", b, False, False, never_ended=1)

    b = clean()
    b.call(1, "mark", "p1-e9", 20, 21)
    b.final(1, "check", "p1-e9", found=False)
    case("a lost mark fails when durable", b, True, False, lost=1)
    case("a lost mark is counted when not durable", b, False, True, lost=1)

    b = clean()
    b.call(1, "mark", "p1-e9", 20, 21)
    b.call(2, "check", "p1-e9", 22, 23, found=False)
    case("a check missing an acknowledged mark is a loss", b, True, False, lost=1)

    b = clean()
    b.call(1, "mark", "p1-e9", 20, 22)
    b.call(2, "check", "p1-e9", 21, 23, found=False)
    case("a check concurrent with the mark is no loss", b, True, True, lost=0)

    b = clean()
    b.call(1, "claim", "s", 100, 101, status="acquired", token=1, took_over=False)
    b.call(2, "claim", "s", 2000, 2001, status="acquired", token=2, took_over=True)
    b.complete(1, "s", 1, 2002, 2003)
    case("a completion accepted after the key was claimed anew fails", b, False, False, stale=1)

    b = clean()
    b.call(1, "claim", "d", 100, 101, status="acquired", token=1, took_over=False)
    b.call(2, "claim", "d", 100.5, 102, status="acquired", token=2, took_over=False)
    b.complete(1, "d", 1, 103, 104)
    b.complete(2, "d", 2, 103.5, 105)
    case("two concurrent accepted completions fail", b, False, False, doubled=1)

    b = clean()
    b.call(1, "claim", "l", 100, 101, status="acquired", token=1, took_over=False)
    b.complete(1, "l", 1, 102, 103)
    b.call(2, "claim", "l", 200, 201, status="acquired", token=2, took_over=False)
    b.complete(2, "l", 2, 202, 203)
    b.final(1, "get", "l", state="completed", token=2, value="p2-t2")
    b.final(2, "get", "l", state="completed", token=2, value="p2-t2")
    case("a completion forgotten and run again is counted when not durable", b, False, True, doubled=1, lost=1)
    case("a completion forgotten and run again fails when durable", b, True, False, doubled=1)

    b = clean()
    b.call(2, "get", "k", 8, 9, state="completed", token=11, value="p9-t11")
    case("a value never written fails", b, False, False, phantom=1)

    b = clean()
    b.complete(1, "m", 3, 20, 21, outcome="fail", **{"class": "in_doubt"})
    b.final(1, "get", "m", state="completed", token=3, value="p1-t3")
    case("an in-doubt completion found later is fine", b, True, True, in_doubt=2, phantom=0)

    failures = 0
    for name, builder, durable, expect_pass, expect in cases:
        figures, violations = check(builder.lines, durable)
        good = (not violations) == expect_pass and all(figures[k] == v for k, v in expect.items())
        print(f"{'ok  ' if good else 'FAIL'} {name}")
        if not good:
            failures += 1
            print(f"     figures {figures}\n     violations {violations}")
    # The file reader: a directory of histories, read back.
    with tempfile.TemporaryDirectory() as directory:
        for p in (1, 2, 3):
            with open(os.path.join(directory, f"p{p}.jsonl"), "w", encoding="utf-8") as f:
                for line in clean().lines:
                    if line["p"] == p:
                        f.write(json.dumps(line) + "\n")
        figures, violations = check(load([directory]), True)
        good = not violations and figures["calls"] == sum(1 for line in clean().lines if line["phase"] == "invoke")
        print(f"{'ok  ' if good else 'FAIL'} histories read from a directory")
        failures += 0 if good else 1
    print(f"self-test: {len(cases) + 1 - failures} passed, {failures} failed")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="history files, or directories of *.jsonl")
    parser.add_argument("--mode", default="run", help="name printed with the figures")
    parser.add_argument("--durable", action="store_true", help="lost acknowledged work is a violation")
    parser.add_argument("--json", help="also write the figures to this file (JSON)")
    parser.add_argument("--self-test", action="store_true", help="check the checker")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if not args.paths:
        parser.error("no history given")
    figures, violations = check(load(args.paths), args.durable)
    print_figures(args.mode, figures, violations, args.durable)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(dict(mode=args.mode, durable=args.durable, violations=len(violations), **figures), f)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
