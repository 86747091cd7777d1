#!/usr/bin/env python3
"""End-to-end tests of `idem proxy` with real clients (Python requests, curl, raw sockets) and a
real upstream (tests/http/upstream.py, aiohttp) that counts its side effects.

  python3 tests/http/proxy_test.py --idem build/asan/tools/idem/idem [unittest arguments]

ctest runs it as process.http_proxy. The stores are a SQLite file of the test's own and, when
scripts/servers.sh exported them, Redis (IDEM_TEST_REDIS_URL) and PostgreSQL
(IDEM_TEST_POSTGRES_URL), each under a prefix or schema of the run's own; without a server its
tests are skipped (failed under IDEM_REQUIRE_SERVERS=1).

No sleep synchronises anything: a request is held inside the upstream by a gate file
(X-Gate) until the test opens it, and the tests wait for observable states (a gate reached, a
metric, a process ended), each bounded so a hang fails instead of blocking the suite.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
IDEM = None
LIMIT = 60.0  # seconds any awaited state may take before the test fails


def wait_for(predicate, what, limit=LIMIT):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("timed out waiting for " + what)


def server_url(name):
    url = os.environ.get(name, "")
    if not url and os.environ.get("IDEM_REQUIRE_SERVERS") == "1":
        raise AssertionError(name + " is not set but IDEM_REQUIRE_SERVERS=1: run through "
                             "scripts/servers.sh")
    return url


class Upstream:
    """tests/http/upstream.py in a process of its own."""

    def __init__(self, directory, port=0):
        self.dir = directory
        self.port = port
        self.process = None
        self.start()

    def start(self):
        if self.process and self.process.stdout:
            self.process.stdout.close()
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "upstream.py"), "--dir", self.dir, "--port",
             str(self.port)], stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        match = re.match(r"listening on (\d+)", line)
        if not match:
            raise AssertionError("the upstream did not start: %r" % line)
        self.port = int(match.group(1))

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(LIMIT)
        if self.process and self.process.stdout:
            self.process.stdout.close()

    def effects(self, effect=None):
        path = os.path.join(self.dir, "effects.log")
        if not os.path.exists(path):
            return 0
        with open(path) as log:
            lines = [line.split()[0] for line in log if line.strip()]
        return len(lines) if effect is None else lines.count(effect)

    def reached(self, gate):
        return os.path.exists(os.path.join(self.dir, gate + ".started"))

    def abandoned(self, gate):
        return os.path.exists(os.path.join(self.dir, gate + ".abandoned"))

    def open(self, gate):
        open(os.path.join(self.dir, gate + ".open"), "w").close()


class Proxy:
    """One `idem proxy` process."""

    def __init__(self, upstream_port, store, *args, config=None, log=None):
        command = [IDEM, "proxy", "--listen", "127.0.0.1:0", "--upstream",
                   "127.0.0.1:%d" % upstream_port, "--store", store, "--metrics-listen",
                   "127.0.0.1:0"]
        if config:
            command += ["--config", config]
        command += list(args)
        self.log_path = log or tempfile.mktemp(prefix="idem-proxy-", suffix=".log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.log,
                                        text=True)
        self.scheme = None
        self.port = None
        self.metrics_port = None
        for _ in range(2):
            line = self.process.stdout.readline()
            match = re.search(r"listening on (https?)://127\.0\.0\.1:(\d+)", line)
            if match:
                self.scheme, self.port = match.group(1), int(match.group(2))
            match = re.search(r"metrics on http://127\.0\.0\.1:(\d+)", line)
            if match:
                self.metrics_port = int(match.group(1))
        if not self.port or not self.metrics_port:
            self.process.kill()
            raise AssertionError("the proxy did not start: " + self.stderr())

    def url(self, path):
        return "%s://127.0.0.1:%d%s" % (self.scheme, self.port, path)

    def stderr(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as log:
            return log.read()

    def metrics(self):
        text = requests.get("http://127.0.0.1:%d/metrics" % self.metrics_port, timeout=LIMIT).text
        values = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
        return values

    def metric(self, name, **labels):
        wanted = name + ("{" + ",".join('%s="%s"' % kv for kv in labels.items()) + "}"
                         if labels else "")
        return self.metrics().get(wanted, 0.0)

    def stop(self, sig=signal.SIGTERM):
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(LIMIT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        self.process.stdout.close()
        return self.process.returncode


def raw(port, data, read=True, limit=LIMIT):
    """Sends bytes on a new connection and returns everything read until the proxy closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as connection:
        connection.sendall(data)
        if not read:
            return b""
        chunks = []
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def status_of(response_bytes):
    match = re.match(rb"HTTP/1\.1 (\d{3})", response_bytes)
    return int(match.group(1)) if match else None


def curl(*args):
    result = subprocess.run(["curl", "-s", "-i", "--max-time", str(int(LIMIT))] + list(args),
                            capture_output=True, timeout=LIMIT + 5)
    out = result.stdout
    # Skip interim responses (100 Continue).
    while out.startswith(b"HTTP/1.1 100"):
        out = out.split(b"\r\n\r\n", 1)[1]
    head, _, body = out.partition(b"\r\n\r\n")
    return status_of(head), head.decode("latin-1"), body


def key():
    return '"%s"' % uuid.uuid4()


def assert_duplicate_joined(test, upstream, gate, first, second, results):
    """Opens `gate`, on which the first request waits at the upstream, and waits for the threads
    of both requests: the second, a duplicate that waited for the first, replays its response and
    the upstream's side effect ran once."""
    upstream.open(gate)
    first.join(LIMIT)
    second.join(LIMIT)
    test.assertEqual(results["first"].status_code, 201)
    test.assertEqual(results["second"].status_code, 201)
    test.assertEqual(results["second"].headers["Idempotent-Replayed"], "true")
    test.assertEqual(results["second"].content, results["first"].content)
    test.assertEqual(upstream.effects(gate), 1)


MAIN_CONFIG = """
[limits]
max_request_body = "64KiB"
max_buffered_response = "64KiB"
header_timeout = "2s"
body_timeout = "5s"
upstream_timeout = "30s"

[principal]
headers = ["Authorization"]

[[route]]
name = "payments"
methods = ["POST"]
path = "/v1/payments/*"
required = true
[route.fingerprint]
body = "json"

[[route]]
name = "reject"
path = "/reject/*"
while_running = "reject"

[[route]]
name = "spent"
path = "/spent/*"
after_finished = "reject"

[[route]]
name = "rerun"
path = "/rerun/*"
after_finished = "rerun_failed"

[[route]]
name = "stripe"
path = "/stripe/*"
keep_transient = true

[[route]]
name = "small"
path = "/small/*"
max_stored_body = 1024

[[route]]
name = "default"
path = "/*"
"""


class ProxyCase(unittest.TestCase):
    """One upstream and one proxy on a SQLite store for the whole class."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="idem-http-")
        cls.upstream = Upstream(cls.dir)
        cls.config = os.path.join(cls.dir, "proxy.toml")
        with open(cls.config, "w") as config:
            config.write(MAIN_CONFIG)
        cls.proxy = Proxy(cls.upstream.port, "sqlite://" + os.path.join(cls.dir, "proxy.db"),
                          config=cls.config)

    @classmethod
    def tearDownClass(cls):
        code = cls.proxy.stop()
        cls.upstream.stop()
        with open(cls.proxy.log_path) as log:
            stderr = log.read()
        assert code == 0, "the proxy exited with %s: %s" % (code, stderr)
        assert "ERROR: AddressSanitizer" not in stderr and "runtime error" not in stderr, stderr
        shutil.rmtree(cls.dir, ignore_errors=True)

    def post(self, path, idem_key=None, body='{"amount": 5}', headers=None, **kwargs):
        fields = {"Content-Type": "application/json"}
        if idem_key is not None:
            fields["Idempotency-Key"] = idem_key
        fields.update(headers or {})
        return requests.post(self.proxy.url(path), data=body, headers=fields, timeout=LIMIT,
                             **kwargs)

    # ---- the rules ------------------------------------------------------------------------

    def test_first_request_runs_and_duplicates_replay(self):
        k = key()
        first = self.post("/v1/payments/a", k, headers={"X-Effect-Id": "replay"})
        self.assertEqual(first.status_code, 201)
        self.assertIn("Idempotency-Key-Expires", first.headers)
        self.assertNotIn("Idempotent-Replayed", first.headers)
        self.assertEqual(first.headers["X-Seen-Key"], k)  # the upstream sees the key too
        for _ in range(3):
            again = self.post("/v1/payments/a", k, headers={"X-Effect-Id": "replay"})
            self.assertEqual(again.status_code, 201)
            self.assertEqual(again.headers["Idempotent-Replayed"], "true")
            self.assertEqual(again.content, first.content)
            self.assertEqual(again.headers["Location"], first.headers["Location"])
            self.assertEqual(again.headers["Content-Type"], "application/json")
            self.assertNotIn("X-Trace", again.headers)  # not in stored_headers
            self.assertEqual(again.headers["Idempotency-Key-Expires"],
                             first.headers["Idempotency-Key-Expires"])
        self.assertEqual(self.upstream.effects("replay"), 1)

    def test_json_fingerprint_ignores_member_order_and_spacing(self):
        k = key()
        first = self.post("/v1/payments/j", k, body='{"a": 1, "b": [1, 2]}')
        again = self.post("/v1/payments/j", k, body='{"b":[1,2],"a":1}')
        self.assertEqual(again.status_code, first.status_code)
        self.assertEqual(again.headers.get("Idempotent-Replayed"), "true")

    def test_missing_key_on_a_required_route_is_400(self):
        response = self.post("/v1/payments/a", None)
        self.assertEqual(response.status_code, 400)
        self.assertEqual(response.headers["Content-Type"], "application/problem+json")
        problem = response.json()
        self.assertEqual(problem["code"], "key-missing")
        self.assertEqual(problem["status"], 400)
        # An optional route forwards without a key.
        self.assertEqual(self.post("/other", None).status_code, 201)

    def test_key_must_be_one_sf_string(self):
        self.assertEqual(self.post("/v1/payments/a", "bare-key").json()["code"], "key-invalid")
        self.assertEqual(self.post("/v1/payments/a", '"%s"' % ("x" * 256)).json()["code"],
                         "key-invalid")
        self.assertEqual(self.post("/v1/payments/a", '"a\\qb"').status_code, 400)
        status, _, body = curl("-X", "POST", self.proxy.url("/v1/payments/a"), "-H",
                               'Idempotency-Key: "a"', "-H", 'Idempotency-Key: "a"', "-d", "{}")
        self.assertEqual(status, 400)
        self.assertEqual(json.loads(body)["code"], "key-repeated")
        # Parameters are allowed and ignored (RFC 8941 items may carry them).
        k = str(uuid.uuid4())
        first = self.post("/v1/payments/p", '"%s";v=1' % k)
        self.assertEqual(first.status_code, 201)
        again = self.post("/v1/payments/p", '"%s"; other=?0' % k)
        self.assertEqual(again.headers.get("Idempotent-Replayed"), "true")

    def test_a_different_request_with_the_key_is_422_on_every_path(self):
        k = key()
        self.assertEqual(self.post("/v1/payments/m", k, body='{"amount": 5}').status_code, 201)
        refused = self.post("/v1/payments/m", k, body='{"amount": 6}')
        self.assertEqual(refused.status_code, 422)
        self.assertEqual(refused.json()["code"], "fingerprint-mismatch")
        # While the first request runs, under both while_running policies.
        for path in ("/default/m", "/reject/m"):
            k = key()
            gate = "mismatch-" + uuid.uuid4().hex
            holder = threading.Thread(target=self.post, args=(path, k),
                                      kwargs={"body": "one", "headers": {"X-Gate": gate}})
            holder.start()
            wait_for(lambda: self.upstream.reached(gate), "the first request at the upstream")
            self.assertEqual(self.post(path, k, body="two").status_code, 422)
            self.upstream.open(gate)
            holder.join(LIMIT)

    def test_query_counts_in_the_fingerprint(self):
        k = key()
        self.assertEqual(self.post("/q?a=1&b=2", k).status_code, 201)
        self.assertEqual(self.post("/q?b=2&a=1", k).headers.get("Idempotent-Replayed"), "true")
        self.assertEqual(self.post("/q?a=1&b=3", k).status_code, 422)

    def test_a_concurrent_duplicate_joins_and_replays(self):
        k = key()
        gate = "join-" + uuid.uuid4().hex
        results = {}

        def first():
            results["first"] = self.post("/join", k, headers={"X-Gate": gate, "X-Effect-Id": gate})

        holder = threading.Thread(target=first)
        holder.start()
        wait_for(lambda: self.upstream.reached(gate), "the first request at the upstream")
        joins = self.proxy.metric("idem_proxy_joins_total", route="default")
        waits = self.proxy.metric("idem_proxy_waits_total", route="default")

        def second():
            results["second"] = self.post("/join", k, headers={"X-Effect-Id": gate})

        waiter = threading.Thread(target=second)
        waiter.start()
        wait_for(lambda: self.proxy.metric("idem_proxy_waits_total", route="default") == waits + 1,
                 "the duplicate waiting in the proxy")
        assert_duplicate_joined(self, self.upstream, gate, holder, waiter, results)
        self.assertEqual(self.proxy.metric("idem_proxy_joins_total", route="default"), joins + 1)

    def test_a_concurrent_duplicate_under_reject_is_409(self):
        k = key()
        gate = "reject-" + uuid.uuid4().hex
        holder = threading.Thread(target=self.post, args=("/reject/x", k),
                                  kwargs={"headers": {"X-Gate": gate}})
        holder.start()
        wait_for(lambda: self.upstream.reached(gate), "the first request at the upstream")
        refused = self.post("/reject/x", k)
        self.assertEqual(refused.status_code, 409)
        self.assertEqual(refused.json()["code"], "in-progress")
        self.assertEqual(refused.headers["Retry-After"], "1")
        self.upstream.open(gate)
        holder.join(LIMIT)
        self.assertEqual(self.post("/reject/x", k).headers.get("Idempotent-Replayed"), "true")

    def test_a_spent_key_is_409_under_after_finished_reject(self):
        k = key()
        self.assertEqual(self.post("/spent/x", k).status_code, 201)
        refused = self.post("/spent/x", k)
        self.assertEqual(refused.status_code, 409)
        self.assertEqual(refused.json()["code"], "key-spent")

    def test_transient_outcomes_release_the_key(self):
        for status in (500, 503, 429):
            k = key()
            effect = "transient-%d-%s" % (status, uuid.uuid4().hex)
            first = self.post("/t", k, headers={"X-Status": str(status), "X-Effect-Id": effect})
            self.assertEqual(first.status_code, status)
            self.assertNotIn("Idempotency-Key-Expires", first.headers)
            retry = self.post("/t", k, headers={"X-Effect-Id": effect})
            self.assertEqual(retry.status_code, 201)  # it ran again
            self.assertNotIn("Idempotent-Replayed", retry.headers)
            self.assertEqual(self.upstream.effects(effect), 2)

    def assert_failure_kept(self, path, status, effect, retry_headers):
        """A request to `path` that fails with `status` is kept: a retry of its key (sent with
        `retry_headers`) replays that status, and the upstream ran once."""
        k = key()
        self.assertEqual(self.post(path, k, headers={"X-Status": str(status), "X-Effect-Id": effect})
                         .status_code, status)
        again = self.post(path, k, headers=retry_headers)
        self.assertEqual(again.status_code, status)
        self.assertEqual(again.headers["Idempotent-Replayed"], "true")
        self.assertEqual(self.upstream.effects(effect), 1)

    def test_terminal_failures_replay_unless_the_route_reruns_them(self):
        effect = "failure-" + uuid.uuid4().hex
        self.assert_failure_kept("/f", 404, effect, {"X-Effect-Id": effect})
        k = key()
        effect = "rerun-" + uuid.uuid4().hex
        self.post("/rerun/f", k, headers={"X-Status": "404", "X-Effect-Id": effect})
        self.assertEqual(self.post("/rerun/f", k, headers={"X-Effect-Id": effect}).status_code, 201)
        self.assertEqual(self.post("/rerun/f", k).headers.get("Idempotent-Replayed"), "true")
        self.assertEqual(self.upstream.effects(effect), 2)

    def test_keep_transient_replays_a_500_like_stripe(self):
        self.assert_failure_kept("/stripe/x", 500, "stripe-" + uuid.uuid4().hex, None)

    def test_the_principal_scopes_the_key(self):
        k = key()
        effect = "principal-" + uuid.uuid4().hex
        alice = {"Authorization": "Bearer alice", "X-Effect-Id": effect}
        mallory = {"Authorization": "Bearer mallory", "X-Effect-Id": effect}
        first = self.post("/v1/payments/s", k, headers=alice)
        guess = self.post("/v1/payments/s", k, headers=mallory)
        self.assertNotIn("Idempotent-Replayed", guess.headers)  # a request of mallory's own
        self.assertNotEqual(guess.content, first.content)
        self.assertEqual(self.post("/v1/payments/s", k, headers=alice).content, first.content)
        self.assertEqual(self.upstream.effects(effect), 2)

    def test_the_route_and_path_scope_the_key(self):
        k = key()
        self.assertEqual(self.post("/v1/payments/one", k).status_code, 201)
        self.assertNotIn("Idempotent-Replayed", self.post("/v1/payments/two", k).headers)
        self.assertNotIn("Idempotent-Replayed", self.post("/reject/one", k).headers)

    # ---- bodies ---------------------------------------------------------------------------

    def test_request_body_cap_is_413_with_and_without_100_continue(self):
        big = "x" * (65 * 1024)
        self.assertEqual(self.post("/big", key(), body=big).status_code, 413)
        status, _, _ = curl("-X", "POST", self.proxy.url("/big"), "-H", "Idempotency-Key: " + key(),
                            "-H", "Expect: 100-continue", "--data-binary", big)
        self.assertEqual(status, 413)
        # Under the cap, a 100-continue upload goes through.
        status, _, _ = curl("-X", "POST", self.proxy.url("/big"), "-H", "Idempotency-Key: " + key(),
                            "-H", "Expect: 100-continue", "--data-binary", "y" * 4000)
        self.assertEqual(status, 201)

    def test_a_chunked_upload_has_the_fingerprint_of_its_bytes(self):
        k = key()
        body = '{"amount": 7}'
        status, _, first = curl("-X", "POST", self.proxy.url("/v1/payments/c"), "-H",
                                "Idempotency-Key: " + k, "-H", "Transfer-Encoding: chunked",
                                "-H", "Content-Type: application/json", "--data-binary", body)
        self.assertEqual(status, 201)
        again = self.post("/v1/payments/c", k, body=body)
        self.assertEqual(again.headers.get("Idempotent-Replayed"), "true")
        self.assertEqual(again.content, first)
        self.assertEqual(json.loads(first)["body"], body)  # the upstream got the whole body

    def test_a_chunked_response_is_kept_and_replayed(self):
        k = key()
        first = self.post("/chunked", k, headers={"X-Chunked": "1", "X-Body-Size": "5000"})
        self.assertEqual(len(first.content), 5000)
        again = self.post("/chunked", k, headers={"X-Chunked": "1", "X-Body-Size": "5000"})
        self.assertEqual(again.headers["Idempotent-Replayed"], "true")
        self.assertEqual(again.content, first.content)

    def test_a_response_above_the_stored_cap_passes_through_and_releases(self):
        k = key()
        effect = "large-" + uuid.uuid4().hex
        first = self.post("/small/x", k, headers={"X-Body-Size": "5000", "X-Effect-Id": effect})
        self.assertEqual(len(first.content), 5000)
        self.assertNotIn("Idempotency-Key-Expires", first.headers)
        second = self.post("/small/x", k, headers={"X-Body-Size": "5000", "X-Effect-Id": effect})
        self.assertNotIn("Idempotent-Replayed", second.headers)
        self.assertEqual(self.upstream.effects(effect), 2)

    def test_large_responses_stream_intact(self):
        for chunked in ("0", "1"):
            response = self.post("/stream", None,
                                 headers={"X-Body-Size": "300000", "X-Chunked": chunked})
            self.assertEqual(response.status_code, 201)
            self.assertEqual(len(response.content), 300000)
            self.assertEqual(response.content[:16], b"0123456789abcdef")

    # ---- connections ----------------------------------------------------------------------

    def test_keep_alive_serves_many_requests_on_one_connection(self):
        before = self.proxy.metric("idem_proxy_connections_total")
        with requests.Session() as session:
            for _ in range(5):
                response = session.post(self.proxy.url("/ka"), data="{}", timeout=LIMIT,
                                         headers={"Idempotency-Key": key()})
                self.assertEqual(response.status_code, 201)
        self.assertEqual(self.proxy.metric("idem_proxy_connections_total"), before + 1)

    def test_pipelined_requests_are_answered_in_order(self):
        request = (b"POST /pipe HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n"
                   b"Idempotency-Key: \"%s\"\r\n\r\n{}")
        keys = [uuid.uuid4().hex.encode() for _ in range(3)]
        data = b"".join(request % k for k in keys)
        data += b"GET /last HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        out = raw(self.proxy.port, data)
        self.assertEqual(out.count(b"HTTP/1.1 201"), 4)

    def test_a_client_that_goes_away_still_gets_its_response_kept(self):
        k = key()
        gate = "gone-" + uuid.uuid4().hex
        body = b"{}"
        request = (b"POST /gone HTTP/1.1\r\nHost: a\r\nIdempotency-Key: " + k.encode() +
                   b"\r\nX-Gate: " + gate.encode() + b"\r\nX-Effect-Id: " + gate.encode() +
                   b"\r\nContent-Length: 2\r\n\r\n" + body)
        raw(self.proxy.port, request, read=False)  # sent, then the connection closes
        wait_for(lambda: self.upstream.reached(gate), "the request at the upstream")
        self.upstream.open(gate)
        wait_for(lambda: self.post("/gone", k, body="{}").headers.get("Idempotent-Replayed"),
                 "the abandoned request's response to be kept")
        self.assertEqual(self.upstream.effects(gate), 1)

    def test_malformed_requests_get_400_and_the_proxy_stays_up(self):
        cases = [
            (b"GARBAGE\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\n\r\n", 400),  # no Host
            (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\nabc", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked"
             b"\r\n\r\n0\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
             400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
            (b"POST / HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 431),
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", None),
            (b"POST / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
            (b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", 501),
            # Cut short: the body never comes, the proxy closes after body_timeout (5 s here,
            # well inside LIMIT; the default 60 s would race the client's own LIMIT).
            (b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nab", None),
        ]
        for data, expected in cases:
            out = raw(self.proxy.port, data)
            status = status_of(out)
            if expected is not None:
                self.assertEqual(status, expected, data[:60])
                self.assertIn(b"application/problem+json", out)
            else:
                self.assertIn(status, (None, 400, 505), data[:60])
        self.assertEqual(self.post("/after", None).status_code, 201)

    def test_a_slow_client_is_cut_off_after_the_header_timeout(self):
        before = self.proxy.metric("idem_proxy_rejections_total", reason="timeout")
        with socket.create_connection(("127.0.0.1", self.proxy.port), timeout=LIMIT) as s:
            s.sendall(b"POST / HTTP/1.1\r\nHost: a\r\n")
            closed = False
            deadline = time.monotonic() + LIMIT
            while time.monotonic() < deadline:
                try:
                    s.sendall(b"X-Slow: 1\r\n")  # a byte now and then, never the end
                except OSError:
                    closed = True
                    break
                s.settimeout(0.2)
                try:
                    if s.recv(1) == b"":
                        closed = True
                        break
                except socket.timeout:
                    pass
            self.assertTrue(closed)
        wait_for(lambda: self.proxy.metric("idem_proxy_rejections_total", reason="timeout") > before,
                 "the timeout to be counted")

    def test_http_1_0_clients_are_served(self):
        out = raw(self.proxy.port, b"POST /old HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}")
        self.assertEqual(status_of(out), 201)
        self.assertIn(b"Connection: close", out)

    def test_metrics_and_health(self):
        text = requests.get("http://127.0.0.1:%d/metrics" % self.proxy.metrics_port,
                            timeout=LIMIT)
        self.assertEqual(text.status_code, 200)
        for family in ("idem_proxy_requests_total", "idem_proxy_replays_total",
                       "idem_proxy_joins_total", "idem_proxy_conflicts_total",
                       "idem_proxy_rejections_total", "idem_proxy_upstream_duration_seconds_bucket",
                       "idem_proxy_outcomes_total"):
            self.assertIn(family, text.text)
        health = requests.get("http://127.0.0.1:%d/healthz" % self.proxy.metrics_port,
                              timeout=LIMIT)
        self.assertEqual(health.text, "ok\n")


class DedicatedProxyCase(unittest.TestCase):
    """Cases that need a proxy (or upstream) of their own."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idem-http-")
        self.upstream = Upstream(self.dir)
        self.proxies = []

    def tearDown(self):
        for proxy in self.proxies:
            proxy.stop(signal.SIGKILL)
        self.upstream.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, *args, store=None, upstream_port=None, **kwargs):
        proxy = Proxy(upstream_port or self.upstream.port,
                      store or "sqlite://" + os.path.join(self.dir, "proxy.db"), *args, **kwargs)
        self.proxies.append(proxy)
        return proxy

    def post(self, proxy, path, idem_key, **kwargs):
        kwargs.setdefault("data", "{}")
        headers = {"Idempotency-Key": idem_key}
        headers.update(kwargs.pop("headers", {}))
        return requests.post(proxy.url(path), headers=headers, timeout=LIMIT, **kwargs)

    def test_the_memory_store_serves_one_process(self):
        proxy = self.start(store="memory://")
        k = key()
        first = self.post(proxy, "/m", k)
        self.assertEqual(first.status_code, 201)
        again = self.post(proxy, "/m", k)
        self.assertEqual(again.headers.get("Idempotent-Replayed"), "true")
        self.assertEqual(again.content, first.content)

    def test_the_replay_cache_answers_replays_without_the_store(self):
        proxy = self.start("--replay-cache", "64", "--replay-cache-max-age", "60s")
        k = key()
        effect = {"X-Effect-Id": "cached"}
        first = self.post(proxy, "/c", k, headers=effect)
        self.assertEqual(first.status_code, 201)
        for _ in range(4):
            again = self.post(proxy, "/c", k, headers=effect)
            self.assertEqual(again.status_code, 201)
            self.assertEqual(again.headers["Idempotent-Replayed"], "true")
            self.assertEqual(again.content, first.content)
            self.assertEqual(again.headers["Idempotency-Key-Expires"],
                             first.headers["Idempotency-Key-Expires"])
        other = self.post(proxy, "/c", k, data='{"other": 1}', headers=effect)
        self.assertEqual(other.status_code, 422)
        self.assertEqual(other.json()["code"], "fingerprint-mismatch")
        self.assertEqual(self.upstream.effects("cached"), 1)
        # The first replay read the store; the other three and the 422 came from the cache.
        self.assertEqual(proxy.metric("idem_proxy_replay_cache_hits_total", route="/*"), 4)
        self.assertEqual(proxy.metric("idem_proxy_replays_total", route="/*"), 4)

    def test_upstream_down_is_502_and_releases_the_key(self):
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]
        proxy = self.start(upstream_port=port)
        k = key()
        for _ in range(2):  # the second is not 409: nothing holds the key
            response = self.post(proxy, "/x", k)
            self.assertEqual(response.status_code, 502)
            self.assertEqual(response.json()["code"], "upstream-failed")
        self.assertEqual(proxy.metric("idem_proxy_upstream_errors_total", kind="connect"), 2)

    def test_upstream_timeout_is_504_and_releases_the_key(self):
        proxy = self.start("--upstream-timeout", "1s")
        k = key()
        effect = "slow-" + uuid.uuid4().hex
        response = self.post(proxy, "/slow", k, headers={"X-Delay-Ms": "3000", "X-Effect-Id": effect})
        self.assertEqual(response.status_code, 504)
        retry = self.post(proxy, "/slow", k, headers={"X-Effect-Id": effect})
        self.assertEqual(retry.status_code, 201)
        self.assertNotIn("Idempotent-Replayed", retry.headers)

    def test_an_upstream_crash_mid_request_releases_the_key(self):
        proxy = self.start()
        k = key()
        effect = "crash-" + uuid.uuid4().hex
        crashed = self.post(proxy, "/crash", k, headers={"X-Crash": "after", "X-Effect-Id": effect})
        self.assertEqual(crashed.status_code, 502)
        self.upstream.process.wait(LIMIT)
        self.upstream.start()  # the same port
        retry = self.post(proxy, "/crash", k, headers={"X-Effect-Id": effect})
        self.assertEqual(retry.status_code, 201)  # not 409, not a hang: the claim was released
        # The effect ran before the crash and again on the retry: an upstream that crashes after
        # its side effect needs the key itself (the proxy forwards it) to run it once.
        self.assertEqual(self.upstream.effects(effect), 2)

    def test_sigterm_drains_requests_in_flight(self):
        proxy = self.start("--drain-timeout", "30s")
        k = key()
        gate = "drain-" + uuid.uuid4().hex
        result = {}
        holder = threading.Thread(target=lambda: result.update(
            response=self.post(proxy, "/drain", k, headers={"X-Gate": gate})))
        holder.start()
        wait_for(lambda: self.upstream.reached(gate), "the request at the upstream")
        proxy.process.send_signal(signal.SIGTERM)
        wait_for(lambda: proxy.metric("idem_proxy_draining") == 1, "the drain to start")
        with self.assertRaises(requests.ConnectionError):
            requests.post(proxy.url("/new"), data="{}", timeout=LIMIT)
        self.upstream.open(gate)
        holder.join(LIMIT)
        self.assertEqual(result["response"].status_code, 201)
        self.assertEqual(result["response"].headers.get("Connection"), "close")
        self.assertEqual(proxy.process.wait(LIMIT), 0)
        self.assertIn("drained", proxy.stderr())

    def test_the_connection_limit_queues_new_connections(self):
        proxy = self.start("--max-connections", "1")
        with socket.create_connection(("127.0.0.1", proxy.port)) as held:
            held.sendall(b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}")
            self.assertEqual(status_of(held.recv(65536)), 201)
            result = {}
            waiting = threading.Thread(target=lambda: result.update(
                response=requests.post(proxy.url("/b"), data="{}", timeout=LIMIT)))
            waiting.start()
            wait_for(lambda: proxy.metric("idem_proxy_connections") == 1 and waiting.is_alive(),
                     "the second connection to wait")
            self.assertNotIn("response", result)
        waiting.join(LIMIT)
        self.assertEqual(result["response"].status_code, 201)

    def test_tls_termination_and_the_client_certificate_as_principal(self):
        d = self.dir
        openssl = ["openssl"]

        def run(*args):
            subprocess.run(openssl + list(args), check=True, capture_output=True)

        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", d + "/ca.key", "-out", d + "/ca.crt", "-subj", "/CN=idem test CA",
            "-days", "2")
        for name, cn in (("server", "localhost"), ("alice", "alice"), ("bob", "bob")):
            run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", "%s/%s.key" % (d, name), "-out", "%s/%s.csr" % (d, name), "-subj",
                "/CN=" + cn)
            extension = "%s/%s.ext" % (d, name)
            with open(extension, "w") as ext:
                ext.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n" if name == "server"
                          else "extendedKeyUsage=clientAuth\n")
            run("x509", "-req", "-in", "%s/%s.csr" % (d, name), "-CA", d + "/ca.crt", "-CAkey",
                d + "/ca.key", "-CAcreateserial", "-out", "%s/%s.crt" % (d, name), "-days", "2",
                "-extfile", extension)
        config = d + "/tls.toml"
        with open(config, "w") as c:
            c.write('[principal]\nclient_certificate = true\nrequired = true\n'
                    '[tls]\ncert = "%s/server.crt"\nkey = "%s/server.key"\nclient_ca = "%s/ca.crt"\n'
                    % (d, d, d))
        proxy = self.start(config=config)
        self.assertEqual(proxy.scheme, "https")
        k = key()
        effect = "tls-" + uuid.uuid4().hex

        def call(who):
            return requests.post(proxy.url("/tls"), data="{}", timeout=LIMIT, verify=d + "/ca.crt",
                                 cert=("%s/%s.crt" % (d, who), "%s/%s.key" % (d, who)),
                                 headers={"Idempotency-Key": k, "X-Effect-Id": effect})

        first = call("alice")
        self.assertEqual(first.status_code, 201)
        self.assertEqual(call("alice").headers.get("Idempotent-Replayed"), "true")
        self.assertNotIn("Idempotent-Replayed", call("bob").headers)  # bob's own request
        self.assertEqual(self.upstream.effects(effect), 2)
        anonymous = requests.post(proxy.url("/tls"), data="{}", timeout=LIMIT,
                                  verify=d + "/ca.crt", headers={"Idempotency-Key": k})
        self.assertEqual(anonymous.status_code, 400)
        self.assertEqual(anonymous.json()["code"], "principal-missing")

    def test_configuration_errors_name_the_setting(self):
        bad = self.dir + "/bad.toml"
        cases = [
            ('[[route]]\npath = "payments"\n', "path"),
            ('[[route]]\nwhile_running = "sometimes"\n', "while_running"),
            ('[limits]\nheader_timeout = "5 minutes"\n', "header_timeout"),
            ('listen = "nowhere"\n', "--listen"),
            ('[key]\ncharset = "emoji"\n', "charset"),
            ('typo = 1\n', "typo"),
            ('[replay_cache]\nmax_entries = 8\nmax_age = "0s"\n', "replay_cache.max_age"),
            ('[replay_cache]\nentries = 8\n', "entries"),
            ('[[route]\n', "bad.toml:1"),
        ]
        for text, named in cases:
            with open(bad, "w") as f:
                f.write(text)
            result = subprocess.run([IDEM, "proxy", "--check", "--config", bad, "--upstream",
                                     "127.0.0.1:1", "--store", "memory://"], capture_output=True,
                                    text=True, timeout=LIMIT)
            self.assertEqual(result.returncode, 2, text)
            self.assertIn(named, result.stderr, text)
        example = subprocess.run([IDEM, "proxy", "--check", "--config",
                                  os.path.join(HERE, "..", "..", "examples", "idem-proxy.toml")],
                                 capture_output=True, text=True, timeout=LIMIT)
        self.assertEqual(example.returncode, 0, example.stderr)
        self.assertIn("3 route(s)", example.stdout)
        ok = subprocess.run([IDEM, "proxy", "--check", "--upstream", "127.0.0.1:1", "--store",
                             "memory://", "--require-key", "--while-running", "reject"],
                            capture_output=True, text=True, timeout=LIMIT)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertIn("(key required), while running reject", ok.stdout)


class SharedStoreCase:
    """Two proxy processes on one store (mixed into a TestCase per store)."""

    store_env = None

    def store_url(self):
        raise NotImplementedError

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idem-http-")
        self.url = self.store_url()
        if not self.url:
            self.skipTest("no server for this store (run through scripts/servers.sh)")
        self.upstream = Upstream(self.dir)
        self.proxies = []

    def tearDown(self):
        for proxy in self.proxies:
            proxy.stop(signal.SIGKILL)
        if hasattr(self, "upstream"):
            self.upstream.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, *args):
        proxy = Proxy(self.upstream.port, self.url, *args)
        self.proxies.append(proxy)
        return proxy

    def post(self, proxy, path, idem_key, **headers):
        headers["Idempotency-Key"] = idem_key
        return requests.post(proxy.url(path), data="{}", headers=headers, timeout=LIMIT)

    def test_a_duplicate_at_another_replica_waits_and_replays(self):
        a, b = self.start(), self.start()
        k = key()
        gate = "cross-" + uuid.uuid4().hex
        results = {}
        first = threading.Thread(target=lambda: results.update(
            first=self.post(a, "/cross", k, **{"X-Gate": gate, "X-Effect-Id": gate})))
        first.start()
        wait_for(lambda: self.upstream.reached(gate), "the first request at the upstream")
        second = threading.Thread(target=lambda: results.update(
            second=self.post(b, "/cross", k, **{"X-Effect-Id": gate})))
        second.start()
        wait_for(lambda: b.metric("idem_proxy_waits_total", route="/*") == 1,
                 "the duplicate waiting at the second proxy")
        assert_duplicate_joined(self, self.upstream, gate, first, second, results)
        self.assertEqual(b.metric("idem_proxy_joins_total", route="/*"), 1)

    def test_a_killed_proxys_claim_is_taken_over_after_its_lease(self):
        a = self.start("--lease", "2s")
        b = self.start("--lease", "2s", "--max-wait", "60s")
        k = key()
        gate = "kill-" + uuid.uuid4().hex
        doomed = threading.Thread(target=lambda: self.assertRaises(
            requests.ConnectionError, self.post, a, "/kill", k,
            **{"X-Gate": gate, "X-Effect-Id": gate}))
        doomed.start()
        wait_for(lambda: self.upstream.reached(gate), "the request at the upstream")
        a.stop(signal.SIGKILL)  # mid-request: its claim stays in the store, unrenewed
        doomed.join(LIMIT)
        # The upstream sees its caller go away before the side effect.
        wait_for(lambda: self.upstream.abandoned(gate), "the upstream to drop the request")
        self.upstream.open(gate)
        retry = self.post(b, "/kill", k, **{"X-Effect-Id": gate})
        self.assertEqual(retry.status_code, 201)
        self.assertNotIn("Idempotent-Replayed", retry.headers)
        self.assertEqual(b.metric("idem_proxy_takeovers_total", route="/*"), 1)
        self.assertEqual(self.upstream.effects(gate), 1)  # once, by the proxy that took over
        self.assertEqual(self.post(b, "/kill", k).headers.get("Idempotent-Replayed"), "true")


class SqliteSharedStore(SharedStoreCase, unittest.TestCase):
    def store_url(self):
        return "sqlite://" + os.path.join(self.dir, "shared.db")


class RedisSharedStore(SharedStoreCase, unittest.TestCase):
    def store_url(self):
        url = server_url("IDEM_TEST_REDIS_URL")
        return url and url + "?prefix=http-%s:" % uuid.uuid4().hex[:12]


class PostgresSharedStore(SharedStoreCase, unittest.TestCase):
    def store_url(self):
        url = server_url("IDEM_TEST_POSTGRES_URL")
        return url and url + ("&" if "?" in url else "?") + "schema=http_%s" % uuid.uuid4().hex[:12]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--idem", required=True)
    args, rest = parser.parse_known_args()
    IDEM = os.path.abspath(args.idem)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
