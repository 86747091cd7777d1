#!/usr/bin/env python3
"""An HTTP upstream for the `idem proxy` tests (aiohttp) that counts its side effects.

Every request to any path but /_ is one side effect, appended to the effects file as a line
"<effect id> <method> <path>" (the id is the X-Effect-Id field, else "-") and flushed before the
response starts, so a test counts effects across upstream restarts and crashes. Fields steer the
answer:

  X-Status: 503           the response's status (default 201)
  X-Delay-Ms: 1500        sleep before answering (after the effect)
  X-Gate: name            before the effect, create <dir>/name.started, then wait until
                          <dir>/name.open exists; a client that goes away meanwhile cancels the
                          request before its effect and creates <dir>/name.abandoned
  X-Crash: after          exit the process (os._exit) right after the effect, before answering
  X-Body-Size: 3000000    answer with that many bytes
  X-Chunked: 1            answer with a chunked body

GET /_/ping answers "pong" and counts nothing.

  python3 upstream.py --dir DIR [--port 0]     prints "listening on PORT" once it accepts
"""
import argparse
import asyncio
import json
import os
import sys

from aiohttp import web


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    effects_path = os.path.join(args.dir, "effects.log")
    sequence = {"n": 0}

    async def ping(request):
        return web.Response(text="pong")

    async def handle(request):
        body = await request.read()
        gate = request.headers.get("X-Gate")
        if gate:
            open(os.path.join(args.dir, gate + ".started"), "w").close()
            try:
                while not os.path.exists(os.path.join(args.dir, gate + ".open")):
                    if request.transport is None or request.transport.is_closing():
                        raise asyncio.CancelledError()
                    await asyncio.sleep(0.005)
            except asyncio.CancelledError:
                open(os.path.join(args.dir, gate + ".abandoned"), "w").close()
                raise
        effect = request.headers.get("X-Effect-Id", "-")
        with open(effects_path, "a") as log:
            log.write("%s %s %s\n" % (effect, request.method, request.path))
            log.flush()
            os.fsync(log.fileno())
        sequence["n"] += 1
        if request.headers.get("X-Crash") == "after":
            os._exit(3)
        delay = int(request.headers.get("X-Delay-Ms", "0"))
        if delay:
            await asyncio.sleep(delay / 1000.0)
        status = int(request.headers.get("X-Status", "201"))
        headers = {
            "Location": "/things/%d" % sequence["n"],
            "X-Trace": "trace-%d" % sequence["n"],
            "X-Seen-Key": request.headers.get("Idempotency-Key", ""),
        }
        size = request.headers.get("X-Body-Size")
        if size:
            payload = (b"0123456789abcdef" * (int(size) // 16 + 1))[: int(size)]
            content_type = "application/octet-stream"
        else:
            payload = json.dumps({
                "seq": sequence["n"],
                "effect": effect,
                "body": body.decode("utf-8", "replace"),
                "forwarded_for": request.headers.get("X-Forwarded-For", ""),
            }).encode()
            content_type = "application/json"
        if request.headers.get("X-Chunked") == "1":
            response = web.StreamResponse(status=status, headers=headers)
            response.content_type = content_type
            response.enable_chunked_encoding()
            await response.prepare(request)
            for start in range(0, len(payload), 1000):
                await response.write(payload[start:start + 1000])
            await response.write_eof()
            return response
        return web.Response(status=status, body=payload, headers=headers,
                            content_type=content_type)

    async def start():
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/_/ping", ping)
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", args.port, reuse_address=True)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        print("listening on %d" % port, flush=True)
        while True:
            await asyncio.sleep(3600)

    try:
        asyncio.run(start())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
