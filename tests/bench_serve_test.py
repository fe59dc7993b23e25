#!/usr/bin/env python3
"""tools/bench_serve.py as a user runs it: against its own echo server (800 streams, 2 processes, 10%
abandoned) and against `clawmine serve` on the default model (96 streams of random lengths, 25% abandoned):
every stream that was not abandoned completes (finish "length", usage = max_tokens), no request errs, and
afterwards the server is healthy with no request left running. Then tools/serve_hostile.py beside it: idle
connections, clients sending headers a byte at a time and 1 MB of headers, while well-behaved streams all
complete and the server stays healthy."""
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOOL = os.path.join(ROOT, "tools", "bench_serve.py")
HOSTILE = os.path.join(ROOT, "tools", "serve_hostile.py")
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "clawmine")


def bench(url, *extra):
    r = subprocess.run([sys.executable, TOOL, "--base-url", url, *extra], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def main():
    echo = subprocess.Popen([sys.executable, TOOL, "--echo-server", "18711"], stdout=subprocess.PIPE, text=True)
    try:
        assert "echo server" in echo.stdout.readline()
        res = bench("http://127.0.0.1:18711", "--num-prompts", "800", "--concurrency", "400", "--processes", "2",
                    "--input-len", "32", "--output-len", "32", "--disconnect", "0.1")
        assert res["errors"] == 0 and res["incomplete"] == 0 and res["completed"] + res["abandoned"] == 800, res
        assert res["output_tokens"] == 32 * res["completed"], res
        print("echo: %d streams, %.0f output tok/s (the generator's own ceiling here)" % (800, res["output_tok_s"]))
    finally:
        echo.kill()

    srv = subprocess.Popen([BIN, "serve", "--port", "0", "--max-seqs", "16", "--max-step-tokens", "128", "-t", "2",
                            "--threads-http", "64"], stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in srv.stderr:
            m = re.search(r"on http://[^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port, "server did not start"
        url = "http://127.0.0.1:%d" % port
        res = bench(url, "--num-prompts", "96", "--concurrency", "48", "--input-len", "40", "--output-len", "12",
                    "--range-ratio", "0.5", "--disconnect", "0.25", "--seed", "3")
        assert res["errors"] == 0 and res["incomplete"] == 0 and res["completed"] > 50, res
        assert res["ttft_ms"]["p50"] is not None and res["tpot_ms"]["p50"] is not None, res
        for _ in range(50):  # abandoned streams leave their slots at the next step
            text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
            if re.search(r'^clawmine:num_requests_running\{[^}]*\} 0$', text, re.M):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("requests still running after the load:\n" + text)
        assert urllib.request.urlopen(url + "/health", timeout=10).status == 200
        print("serve: %d completed, %d abandoned, %.0f output tok/s, TTFT p50 %.1f ms" %
              (res["completed"], res["abandoned"], res["output_tok_s"], res["ttft_ms"]["p50"]))
        # A shared system prompt: after the first requests, its state comes from the prefix cache.
        res = bench(url, "--num-prompts", "24", "--concurrency", "4", "--shared-prefix-len", "96", "--input-len", "8",
                    "--output-len", "4", "--seed", "5")
        assert res["errors"] == 0 and res["completed"] == 24 and res["input_tokens"] == 24 * 104, res
        assert res["cached_fraction"] > 0.5, res
        print("shared prefix: %.0f%% of the prompt tokens came from the cache" % (100 * res["cached_fraction"]))
        r = subprocess.run([sys.executable, HOSTILE, "--base-url", url, "--idle", "24", "--slow", "2",
                            "--big-header-bytes", "1000000", "--good", "24", "--concurrency", "12",
                            "--input-len", "24", "--output-len", "8"], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        h = json.loads(r.stdout)
        assert h["completed"] == 24 and h["errors"] == 0 and h["health_after"], h
        assert h["idle_open"] == 24 and h["idle_refused"] == 0, h
        assert h["big_headers"] and "431" in h["big_headers"]["status"], h
        print("hostile: 24 idle, 2 slow, 1 MB of headers beside 24 streams: all complete, TTFT p50 %.1f ms; "
              "big headers got %r" % (h["ttft_ms"]["p50"], h["big_headers"]["status"]))
    finally:
        srv.kill()


if __name__ == "__main__":
    main()
