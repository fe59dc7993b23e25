#!/usr/bin/env bash
# Renders the JSON of `clawmine bench kernels --json-file FILE` as the
# markdown tables of docs/performance.md.
# Usage: tools/gpu_bench_md.sh bench.json
set -euo pipefail
python3 - "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"GPU: {d['gpu']}; same-run device-to-device copy: {d['copy_gbs']:.0f} GB/s (read + write); "
      f"empty kernel in a CUDA graph: {d.get('empty_kernel_us', 0):.2f} us per launch.\n")
print("| case | M | us | GB/s | % of copy | TFLOP/s | cuBLAS BF16 us | cuBLAS TFLOP/s | speedup | copy of same bytes us | path |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for r in d["rows"]:
    if not r["family"].startswith("linear") or r["us"] <= 0:
        continue
    cub = (f"{r['cublas_us']:.2f} | {r['cublas_tflops']:.1f} | {r['speedup_vs_cublas']:.2f}x"
           if r.get('cublas_us', 0) > 0 else "- | - | -")
    print(f"| {r['name']} | {r['M']} | {r['us']:.2f} | {r['gbs']:.0f} | {100*r['frac_copy']:.1f}% | {r['tflops']:.1f} | "
          f"{cub} | {r['copy_us']:.2f} | {r['path']} |")
print()
print("| grouped MoE path (experts touched) | case | us | GB/s over touched experts | % of copy |")
print("|---|---|---:|---:|---:|")
for r in d["rows"]:
    if not r["family"].startswith("moe") or r["us"] <= 0:
        continue
    print(f"| {r['path']} | {r['name']} | {r['us']:.2f} | {r['gbs']:.0f} | {100*r['frac_copy']:.1f}% |")
PY
