#!/usr/bin/env python3
"""Hostile clients beside well-behaved ones: does the server keep serving? Against a running OpenAI-compatible
server it opens --idle connections that never send a byte, starts --slow clients that send their headers one
byte every --slow-interval seconds, sends one request with --big-header-bytes of headers, and meanwhile runs
--good streamed completions (bench_serve.py's client, at most --concurrency at once). It reports, as JSON:
how many idle connections the server accepted (and how many it closed, and when), what the big-header request
got back and how fast, the good requests' errors, completeness and TTFT p50/p99, and whether /health answers
at the end. Exit status 1 when a good request failed or was incomplete, or /health did not answer.

  tools/serve_hostile.py --base-url http://127.0.0.1:8080 --idle 2000 --slow 8 --good 64 --json out.json
"""
import argparse
import asyncio
import importlib.util
import json
import os
import random
import sys
import time
from urllib.parse import urlparse

_spec = importlib.util.spec_from_file_location("bench_serve", os.path.join(os.path.dirname(__file__), "bench_serve.py"))
bench_serve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_serve)


async def hold_idle(host, port, n, stats):
    """Opens n connections that send nothing; records when the server closes each."""
    conns = []
    t0 = time.perf_counter()

    async def one():
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
        except Exception as e:  # noqa: BLE001 - a refused or timed-out connect is what we count
            stats["idle_refused"] += 1
            stats.setdefault("idle_errors", []).append(repr(e)[:80])
            return
        stats["idle_open"] += 1
        conns.append(w)
        try:
            await r.read(1)  # returns b"" when the server closes it
            stats["idle_closed_by_server"] += 1
            stats["idle_close_s"].append(time.perf_counter() - t0)
        except Exception:  # noqa: BLE001
            stats["idle_closed_by_server"] += 1
            stats["idle_close_s"].append(time.perf_counter() - t0)

    # Open in batches so the listen backlog is not the thing measured.
    tasks = []
    for i in range(0, n, 200):
        tasks += [asyncio.create_task(one()) for _ in range(min(200, n - i))]
        await asyncio.sleep(0.05)
    return tasks, conns


async def slow_client(host, port, interval, stats):
    """Sends a request's headers one byte at a time; records how the server ends it."""
    t0 = time.perf_counter()
    rec = {"sent": 0, "ended_s": None, "reply": "still sending at the end of the run"}
    stats["slow"].append(rec)
    try:
        r, w = await asyncio.open_connection(host, port)
    except Exception as e:  # noqa: BLE001
        rec["reply"] = repr(e)[:80]
        return
    req = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4096 + b"\r\n\r\n"
    try:
        for b in req:
            w.write(bytes([b]))
            await w.drain()
            rec["sent"] += 1
            try:
                data = await asyncio.wait_for(r.read(200), interval)
                rec["ended_s"] = round(time.perf_counter() - t0, 2)
                rec["reply"] = data[:40].decode("latin-1") or "closed by the server"
                return
            except asyncio.TimeoutError:
                pass
        rec["reply"] = "sent it all"
    except Exception as e:  # noqa: BLE001 - a reset is the server ending it
        rec["ended_s"] = round(time.perf_counter() - t0, 2)
        rec["reply"] = repr(e)[:60]
    finally:
        w.close()


async def big_headers(host, port, nbytes):
    t0 = time.perf_counter()
    try:
        r, w = await asyncio.open_connection(host, port)
        head = b"GET /health HTTP/1.1\r\nHost: x\r\n"
        line = b"X-Pad: " + b"b" * 1000 + b"\r\n"
        w.write(head)
        sent = len(head)
        while sent < nbytes:
            w.write(line)
            sent += len(line)
            try:
                await asyncio.wait_for(w.drain(), 10)
            except Exception:  # noqa: BLE001 - the server stopped reading (it answered or closed)
                break
        w.write(b"\r\n")
        data = await asyncio.wait_for(r.read(200), 30)
        w.close()
        return {"status": data.split(b"\r\n")[0].decode("latin-1") or "closed", "s": round(time.perf_counter() - t0, 3)}
    except Exception as e:  # noqa: BLE001
        return {"status": repr(e)[:80], "s": round(time.perf_counter() - t0, 3)}


async def health(host, port):
    try:
        r, w = await asyncio.open_connection(host, port)
        w.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = await asyncio.wait_for(r.read(100), 30)
        w.close()
        return data.startswith(b"HTTP/1.1 200")
    except Exception:  # noqa: BLE001
        return False


async def run(a):
    u = urlparse(a.base_url)
    host, port = u.hostname, u.port or 80
    stats = {"idle_open": 0, "idle_refused": 0, "idle_closed_by_server": 0, "idle_close_s": [], "slow": []}
    idle_tasks, conns = await hold_idle(host, port, a.idle, stats)
    slow = [asyncio.create_task(slow_client(host, port, a.slow_interval, stats)) for _ in range(a.slow)]
    big = await big_headers(host, port, a.big_header_bytes) if a.big_header_bytes else None
    rng = random.Random(a.seed)
    sem = asyncio.Semaphore(a.concurrency)
    recs = []

    async def good(i):
        async with sem:
            rec = {"itl": [], "max_tokens": a.output_len, "abandoned": False}
            prompt = [rng.randrange(10, a.vocab) for _ in range(a.input_len)]
            body = {"prompt": prompt, "max_tokens": a.output_len, "temperature": 0, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}
            try:
                await bench_serve.one_request(host, port, "/v1/completions", body, 0, rec)
            except Exception as e:  # noqa: BLE001
                rec["error"] = repr(e)[:200]
            recs.append(rec)

    t0 = time.perf_counter()
    await asyncio.gather(*[good(i) for i in range(a.good)])
    wall = time.perf_counter() - t0
    ok = await health(host, port)
    for w in conns:
        w.close()
    for t in slow:
        t.cancel()
    for t in idle_tasks:
        t.cancel()
    await asyncio.gather(*slow, *idle_tasks, return_exceptions=True)
    a.processes, a.request_rate, a.shared_prefix_len = 1, 0.0, 0
    res = bench_serve.report(a, recs, wall)
    closes = sorted(stats["idle_close_s"])
    res.update({"idle_requested": a.idle, "idle_open": stats["idle_open"], "idle_refused": stats["idle_refused"],
                "idle_closed_by_server_during_run": stats["idle_closed_by_server"],
                "idle_close_s_p50": round(bench_serve.pct(closes, 50), 2) if closes else None,
                "slow_clients": stats["slow"], "big_headers": big, "health_after": ok})
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--idle", type=int, default=0, help="connections that never send a byte")
    ap.add_argument("--slow", type=int, default=0, help="clients sending their headers one byte per interval")
    ap.add_argument("--slow-interval", type=float, default=1.0)
    ap.add_argument("--big-header-bytes", type=int, default=0, help="one request with this many bytes of headers")
    ap.add_argument("--good", type=int, default=32, help="well-behaved streamed completions")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = asyncio.run(run(a))
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    bad = res["errors"] or res["incomplete"] or res["completed"] < a.good or not res["health_after"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
