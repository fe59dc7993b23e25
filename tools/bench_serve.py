#!/usr/bin/env python3
"""Load generator for `clawmine serve` (or any OpenAI-compatible server): streamed /v1/completions
requests over raw asyncio HTTP (no client library: one Python process drives thousands of streams), spread
over --processes worker processes. Prompts are token ids, so input lengths are exact: fixed (--input-len,
--output-len, the peers' 8K/1K workload) or random in [len·(1−r), len·(1+r)] (--range-ratio). Requests
arrive at --request-rate per second (Poisson; 0 = all at once) with at most --concurrency in flight;
--disconnect of them are abandoned after a few chunks (the client closes the socket).

Reports output and total (input + output) tok/s, TTFT, TPOT (per output token after the first), ITL
(between streamed chunks) p50/p90/p99, errors, and checks every finished stream: ignore_eos is set, so a
complete stream ends with finish_reason "length" and usage.completion_tokens == its max_tokens; any other
end is an error. --echo-server PORT serves canned streams instantly instead (no model), so running the
generator against it measures the generator's own overhead.

  tools/bench_serve.py --base-url http://127.0.0.1:8080 --num-prompts 2048 --concurrency 256 \\
      --input-len 8192 --output-len 1024 --processes 8 --json out.json
"""
import argparse
import asyncio
import json
import multiprocessing as mp
import random
import sys
import time
import urllib.request
from urllib.parse import urlparse


# ---------------------------------------------------------------- HTTP/1.1 over asyncio streams
async def read_response(reader):
    """Yields the body bytes of a response as they arrive (chunked or not); raises on a bad status."""
    status = await reader.readline()
    if not status.startswith(b"HTTP/1."):
        raise IOError("bad status line %r" % status[:60])
    code = int(status.split()[1])
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    if code != 200:
        body = await reader.read(2000)
        raise IOError("HTTP %d: %s" % (code, body[:200].decode("utf-8", "replace")))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]
    else:
        n = int(headers.get("content-length", "-1"))
        yield await (reader.readexactly(n) if n >= 0 else reader.read())


async def one_request(host, port, path, body, abandon_after, rec):
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        payload = json.dumps(body).encode()
        writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAuthorization: Bearer x\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (path.encode(), host.encode(), len(payload))
                     + payload)
        await writer.drain()
        buf, chunks, last = b"", 0, None
        async for data in read_response(reader):
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                if event == b"data: [DONE]":
                    rec["done"] = True
                    continue
                j = json.loads(event[6:])
                if j.get("usage"):
                    rec["out"] = j["usage"]["completion_tokens"]
                    rec["in"] = j["usage"]["prompt_tokens"]
                    rec["cached"] = (j["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                for c in j.get("choices", []):
                    if c.get("finish_reason"):
                        rec["finish"] = c["finish_reason"]
                    if c.get("text"):
                        now = time.perf_counter()
                        if last is None:
                            rec["ttft"] = now - t0
                        else:
                            rec["itl"].append(now - last)
                        last = now
                        chunks += 1
                if abandon_after and chunks >= abandon_after:
                    rec["abandoned"] = True
                    return
        rec["e2e"] = time.perf_counter() - t0
    finally:
        writer.close()


async def worker_main(a, jobs, out_q):
    u = urlparse(a.base_url)
    host, port = u.hostname, u.port or 80
    path = (u.path.rstrip("/") or "") + ("/v1/completions" if not u.path.rstrip("/").endswith("/v1") else "/completions")
    sem = asyncio.Semaphore(max(1, a.concurrency // a.processes))
    rng = random.Random(a.seed + len(jobs))
    recs = []

    async def run(job):
        async with sem:
            rec = {"itl": [], "max_tokens": job["out"], "abandoned": False}
            body = {"model": a.model, "prompt": job["prompt"], "max_tokens": job["out"], "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            try:
                await one_request(host, port, path, body, job["abandon"], rec)
            except Exception as e:  # noqa: BLE001 - every failure is counted and named
                rec["error"] = repr(e)[:200]
            recs.append(rec)

    tasks, t = [], 0.0
    start = time.perf_counter()
    for job in jobs:
        if a.request_rate > 0:
            t += rng.expovariate(a.request_rate / a.processes)
            delay = start + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(run(job)))
    await asyncio.gather(*tasks)
    out_q.put(recs)


def worker(a, jobs, out_q):
    asyncio.run(worker_main(a, jobs, out_q))


# ---------------------------------------------------------------- the echo server (overhead)
async def echo_handle(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
        body = json.loads(await reader.readexactly(n))
        m, p = int(body.get("max_tokens", 16)), len(body.get("prompt", []))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")

        def chunk(obj):
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        for i in range(m):
            if writer.transport.is_closing():  # the client left (an abandoned stream)
                return
            chunk({"choices": [{"index": 0, "text": "x", "finish_reason": "length" if i == m - 1 else None}]})
            await writer.drain()
        chunk({"choices": [], "usage": {"prompt_tokens": p, "completion_tokens": m, "total_tokens": p + m}})
        chunk(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def echo_server(port):
    srv = await asyncio.start_server(echo_handle, "127.0.0.1", port, backlog=4096)
    print("echo server on http://127.0.0.1:%d" % port, flush=True)
    async with srv:
        await srv.serve_forever()


# ---------------------------------------------------------------- report
def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def report(a, recs, wall):
    done = [r for r in recs if not r.get("error") and not r["abandoned"]]
    errors = [r["error"] for r in recs if r.get("error")]
    incomplete = [r for r in done if not (r.get("done") and r.get("finish") == "length" and r.get("out") == r["max_tokens"])]
    out_tok = sum(r.get("out", 0) for r in done)
    in_tok = sum(r.get("in", 0) for r in done)
    cached_tok = sum(r.get("cached", 0) for r in done)
    tpot = [(r["e2e"] - r["ttft"]) / (r["out"] - 1) for r in done if r.get("ttft") and r.get("out", 0) > 1]
    itl = [x for r in done for x in r["itl"]]
    ttft = [r["ttft"] for r in done if r.get("ttft")]
    ms = lambda v: None if v is None else round(v * 1000, 2)  # noqa: E731
    res = {"requests": len(recs), "completed": len(done), "abandoned": sum(r["abandoned"] for r in recs),
           "errors": len(errors), "incomplete": len(incomplete), "first_errors": errors[:5], "wall_s": round(wall, 3),
           "output_tok_s": round(out_tok / wall, 1), "total_tok_s": round((out_tok + in_tok) / wall, 1),
           "input_tokens": in_tok, "output_tokens": out_tok, "cached_tokens": cached_tok,
           "cached_fraction": round(cached_tok / in_tok, 4) if in_tok else None,
           "concurrency": a.concurrency, "request_rate": a.request_rate, "processes": a.processes,
           "input_len": a.input_len, "output_len": a.output_len, "shared_prefix_len": a.shared_prefix_len}
    for name, xs in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl)):
        res[name] = {"p50": ms(pct(xs, 50)), "p90": ms(pct(xs, 90)), "p99": ms(pct(xs, 99))}
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default=None, help="the model field (default: none sent)")
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--request-rate", type=float, default=0.0)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--shared-prefix-len", type=int, default=0,
                    help="every prompt starts with the same this many tokens (a shared system prompt), then its own")
    ap.add_argument("--range-ratio", type=float, default=0.0, help="random lengths within ±ratio of the given ones")
    ap.add_argument("--vocab", type=int, default=4000, help="prompt token ids are drawn from [10, vocab)")
    ap.add_argument("--disconnect", type=float, default=0.0, help="fraction of streams abandoned after a few chunks")
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the report here too")
    ap.add_argument("--echo-server", type=int, metavar="PORT", help="serve canned streams on PORT (no model)")
    a = ap.parse_args()
    if a.echo_server:
        asyncio.run(echo_server(a.echo_server))
        return
    rng = random.Random(a.seed)

    def length(n):
        return max(1, int(round(n * (1 + rng.uniform(-a.range_ratio, a.range_ratio)))))
    jobs = []
    shared = [rng.randrange(10, a.vocab) for _ in range(a.shared_prefix_len)]
    for i in range(a.num_prompts):
        n_in, n_out = length(a.input_len), length(a.output_len)
        jobs.append({"prompt": shared + [rng.randrange(10, a.vocab) for _ in range(n_in)], "out": n_out,
                     "abandon": rng.randint(1, 3) if rng.random() < a.disconnect else 0})
    if a.model is None:  # the server's own model id (GET /v1/models), else "default"
        try:
            with urllib.request.urlopen(a.base_url.rstrip("/") + "/v1/models", timeout=10) as r:
                a.model = json.load(r)["data"][0]["id"]
        except Exception:  # noqa: BLE001 - a server without the route
            a.model = "default"
    q = mp.Queue()
    procs = [mp.Process(target=worker, args=(a, jobs[p::a.processes], q)) for p in range(a.processes)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    recs = []
    for _ in procs:
        recs += q.get()
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    res = report(a, recs, wall)
    text = json.dumps(res, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    sys.exit(1 if res["errors"] or res["incomplete"] else 0)


if __name__ == "__main__":
    main()
