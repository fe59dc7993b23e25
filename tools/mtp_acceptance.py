#!/usr/bin/env python3
"""MTP acceptance of a checkpoint on held-out text, measured with clawmine itself: for K in --ks and each
temperature, `clawmine generate --mtp K` continues --prompts snippets of the held-out file (a fixed seed
per snippet) and the drafts accepted / proposed and tokens per step are summed from its stats lines; the
text with MTP is checked to be the text without it.

  python3 tools/mtp_acceptance.py --bin build/clawmine -m models/default --heldout models/default/heldout.txt
"""
import argparse
import json
import re
import subprocess


def run(bin_, model, prompt, n, temp, seed, k):
    args = [bin_, "generate", "-m", model, "-p", prompt, "-n", str(n), "--temp", str(temp), "-s", str(seed),
            "--ignore-eos", "--no-display-prompt", "--no-escape", "--device", "cpu"]
    if k:
        args += ["--mtp", str(k)]
    r = subprocess.run(args, capture_output=True, text=True, check=True)
    m = re.search(r"mtp: (\d+) of (\d+) drafts accepted .*\| ([\d.]+) tokens per step over (\d+) steps", r.stderr)
    return r.stdout, (int(m.group(1)), int(m.group(2)), int(m.group(4))) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/clawmine")
    ap.add_argument("-m", "--model", default="models/default")
    ap.add_argument("--heldout", default="models/default/heldout.txt")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--ks", default="1,2,3")
    ap.add_argument("--temps", default="0,0.7")
    ap.add_argument("--json", help="write the table here too")
    a = ap.parse_args()
    lines = [l for l in open(a.heldout, encoding="utf-8").read().split("\n") if len(l) > 40]
    step = max(1, len(lines) // a.prompts)
    prompts = [lines[i * step][:120] for i in range(a.prompts)]
    rows = []
    print("   K  temp  drafts accepted  acceptance  tokens/step (generation steps)  same text")
    for temp in [float(t) for t in a.temps.split(",")]:
        for k in [int(x) for x in a.ks.split(",")]:
            acc = drafted = steps = 0
            same = True
            for i, p in enumerate(prompts):
                plain, _ = run(a.bin, a.model, p, a.n, temp, 100 + i, 0)
                text, st = run(a.bin, a.model, p, a.n, temp, 100 + i, k)
                same = same and text == plain
                acc, drafted, steps = acc + st[0], drafted + st[1], steps + st[2]
            tps = a.n * len(prompts) / steps  # every run emits n tokens; steps include the prefill step
            rows.append({"k": k, "temperature": temp, "drafted": drafted, "accepted": acc,
                         "acceptance": acc / drafted if drafted else 0.0, "tokens_per_step": tps, "same_text": same})
            print(f"{k:4d} {temp:5.1f} {drafted:7d} {acc:8d} {acc / max(drafted, 1):11.3f} {tps:12.2f}"
                  f"{'':20s}{'yes' if same else 'NO'}")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
