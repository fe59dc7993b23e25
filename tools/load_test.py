#!/usr/bin/env python3
"""Load test for `clawmine serve` (or any OpenAI-compatible server) with the official `openai`
async client: N streamed /v1/completions requests, at most C at a time, a fraction of them
abandoned after a few chunks (the client disconnects). Reports throughput and TTFT / TPOT p50
and p99 (JSON with --json).

With --check, every finished stream is verified: prompts come from a small set, each answered
once alone first (greedy, ignore_eos); every streamed answer must equal the lone answer of its own
prompt, carry exactly max_tokens tokens in its usage and finish with "length" — so a response that
was lost, cut, or mixed with another request's tokens fails the run. Afterwards the server must
report no running request (abandoned streams freed their slots) and still be healthy.

  tools/load_test.py --base-url http://127.0.0.1:8080/v1 --n 200 --concurrency 200 \
      --max-tokens 16 --disconnect 0.2 --check
"""
import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
import urllib.request

try:
    import openai
except ImportError:
    sys.exit("load_test.py needs the `openai` package (pip install openai; scripts/deps.sh puts it in .venv)")

WORDS = ("the quick brown fox jumps over a lazy dog while seven small birds sing about rivers "
         "mountains cities numbers colours and the long history of tea").split()


def make_prompts(k, length, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(length)) for _ in range(k)]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[i]


async def one_stream(client, model, prompt, args, abandon_after, rec):
    t0 = time.perf_counter()
    text, first, last, chunks, usage, finish = "", None, None, 0, None, None
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    try:
        async for ch in stream:
            if ch.usage is not None:
                usage = ch.usage
            if not ch.choices:
                continue
            c = ch.choices[0]
            now = time.perf_counter()
            if c.text:
                if first is None:
                    first = now
                last = now
                chunks += 1
                text += c.text
            if c.finish_reason:
                finish = c.finish_reason
            if abandon_after is not None and chunks >= abandon_after:
                break
    finally:
        await stream.close()
    rec.update(prompt=prompt, text=text, chunks=chunks, finish=finish, abandoned=abandon_after is not None,
               ttft=(first - t0) if first else None,
               tpot=((last - first) / (usage.completion_tokens - 1)) if usage and first and usage.completion_tokens > 1
               else None,
               completion_tokens=usage.completion_tokens if usage else None, t_end=time.perf_counter())


def get(url, key):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read().decode()


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--model", default=None, help="default: the server's first model")
    ap.add_argument("--n", type=int, default=200, help="streams in total")
    ap.add_argument("--concurrency", type=int, default=200, help="streams open at once")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prompt-words", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=8, help="distinct prompts")
    ap.add_argument("--disconnect", type=float, default=0.2, help="fraction of streams abandoned early")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check", action="store_true", help="verify every finished answer (see above)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=600)
    model = args.model or (await client.models.list()).data[0].id
    prompts = make_prompts(args.prompts, args.prompt_words, args.seed)
    reference = {}
    if args.check:
        for p in prompts:
            r = await client.completions.create(model=model, prompt=p, max_tokens=args.max_tokens, temperature=0,
                                                extra_body={"ignore_eos": True})
            reference[p] = r.choices[0].text

    sem = asyncio.Semaphore(args.concurrency)
    recs = [dict() for _ in range(args.n)]
    errors = []

    async def task(i):
        async with sem:
            abandon = rng.randint(1, max(1, args.max_tokens // 2)) if rng.random() < args.disconnect else None
            try:
                await one_stream(client, model, prompts[i % len(prompts)], args, abandon, recs[i])
            except Exception as e:  # a request that failed is reported, never hidden
                errors.append(f"stream {i}: {type(e).__name__}: {e}")

    t0 = time.perf_counter()
    await asyncio.gather(*(task(i) for i in range(args.n)))
    wall = time.perf_counter() - t0

    done = [r for r in recs if r and not r["abandoned"]]
    abandoned = [r for r in recs if r and r["abandoned"]]
    tokens = sum(r["completion_tokens"] or 0 for r in done) + sum(r["chunks"] for r in abandoned)
    ttft = [r["ttft"] for r in recs if r and r["ttft"] is not None]
    tpot = [r["tpot"] for r in done if r["tpot"] is not None]
    summary = {
        "streams": args.n, "concurrency": args.concurrency, "finished": len(done), "abandoned": len(abandoned),
        "errors": len(errors), "wall_s": round(wall, 3), "output_tokens": tokens,
        "throughput_tok_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "ttft_p50_s": round(pct(ttft, 50), 4), "ttft_p99_s": round(pct(ttft, 99), 4),
        "tpot_p50_s": round(pct(tpot, 50), 4), "tpot_p99_s": round(pct(tpot, 99), 4),
    }
    problems = list(errors)
    if args.check:
        for i, r in enumerate(recs):
            if not r or r["abandoned"]:
                continue
            if r["text"] != reference[r["prompt"]]:
                problems.append(f"stream {i}: text differs from its prompt's lone answer: {r['text']!r} vs "
                                f"{reference[r['prompt']]!r}")
            if r["completion_tokens"] != args.max_tokens or r["finish"] != "length":
                problems.append(f"stream {i}: usage {r['completion_tokens']} tokens, finish {r['finish']}")
        base = args.base_url.rstrip("/")
        root = base[:-3] if base.endswith("/v1") else base
        running = None
        for _ in range(100):  # abandoned streams free their slots within a step or two
            _, m = get(root + "/metrics", args.api_key)
            running = float(re.search(r"^clawmine:num_requests_running\{[^}]*\} (\S+)", m, re.M).group(1))
            if running == 0:
                break
            await asyncio.sleep(0.1)
        if running != 0:
            problems.append(f"{running} requests still running after the load")
        status, _ = get(root + "/health", args.api_key)
        if status != 200:
            problems.append(f"/health answered {status}")
        summary["checked"] = True
    summary["problems"] = len(problems)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{args.n} streams ({len(done)} finished, {len(abandoned)} abandoned, {len(errors)} errors) "
              f"in {wall:.2f} s: {summary['throughput_tok_s']} tok/s; TTFT p50 {summary['ttft_p50_s']} s "
              f"p99 {summary['ttft_p99_s']} s; TPOT p50 {summary['tpot_p50_s']} s p99 {summary['tpot_p99_s']} s")
    for p in problems[:20]:
        print("PROBLEM:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
