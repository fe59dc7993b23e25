#!/usr/bin/env python3
"""tools/bench_serve.py as a user runs it: against its own echo server (800 streams, 2 processes, 10%
abandoned) and against `clawmine serve` on the default model (96 streams of random lengths, 25% abandoned):
every stream that was not abandoned completes (finish "length", usage = max_tokens), no request errs, and
afterwards the server is healthy with no request left running."""
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOOL = os.path.join(ROOT, "tools", "bench_serve.py")
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
    finally:
        srv.kill()


if __name__ == "__main__":
    main()
