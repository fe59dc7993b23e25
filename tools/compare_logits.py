#!/usr/bin/env python3
"""Compares a `clawmine logits` output with a golden fixture's expected logits.

Usage:
  compare_logits.py tokens FIXTURE_DIR        print the fixture's token ids, comma-separated
  compare_logits.py check FIXTURE_DIR OUT.safetensors [--tol 0.03] [--argmax 0.95]

`check` prints, for the logits of every position: max|Δ| / max|expected|
over the whole tensor, the fraction of rows whose own max|Δ| is within tol of
that row's max|expected|, and the argmax agreement. It exits 1 when the
whole-tensor error exceeds tol or the argmax agreement is below the bound, and
2 on a malformed file. Standard library only (the device machine and CI both
have it), so it reads safetensors by hand: an 8-byte header size, a JSON
header, then the raw little-endian data.
"""
import json
import struct
import sys
from array import array

DTYPES = {"F32": "f", "I64": "q", "I32": "i"}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header size")
    n = struct.unpack("<Q", raw[:8])[0]
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header size {n} runs past the end of the file")
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        code = DTYPES.get(t["dtype"])
        if code is None:
            raise ValueError(f"{path}: tensor '{name}' has dtype {t['dtype']}, expected one of {sorted(DTYPES)}")
        b, e = t["data_offsets"]
        a = array(code)
        a.frombytes(raw[8 + n + b : 8 + n + e])
        if sys.byteorder != "little":
            a.byteswap()
        out[name] = (t["shape"], a)
    return out


def main(argv):
    if len(argv) >= 2 and argv[0] == "tokens":
        exp = read_safetensors(argv[1] + "/expected.safetensors")
        print(",".join(str(int(v)) for v in exp["tokens"][1]))
        return 0
    if len(argv) < 3 or argv[0] != "check":
        print(__doc__, file=sys.stderr)
        return 2
    tol, argmax_bound = 0.03, 0.95
    rest = argv[3:]
    while rest:
        if rest[0] == "--tol":
            tol = float(rest[1])
        elif rest[0] == "--argmax":
            argmax_bound = float(rest[1])
        else:
            print(f"unknown option {rest[0]}", file=sys.stderr)
            return 2
        rest = rest[2:]
    exp_shape, exp = read_safetensors(argv[1] + "/expected.safetensors")["logits"]
    got = read_safetensors(argv[2])
    if "logits" not in got:
        print(f"{argv[2]}: no tensor 'logits'", file=sys.stderr)
        return 2
    got_shape, got = got["logits"]
    if got_shape != exp_shape:
        print(f"{argv[2]}: logits shape {got_shape}, expected {exp_shape}", file=sys.stderr)
        return 2
    rows, vocab = exp_shape
    max_abs = max(abs(v) for v in exp)
    max_diff, rows_ok, argmax_ok = 0.0, 0, 0
    for r in range(rows):
        e = exp[r * vocab : (r + 1) * vocab]
        g = got[r * vocab : (r + 1) * vocab]
        if any(v != v or v in (float("inf"), float("-inf")) for v in g):
            print(f"row {r}: non-finite logits", file=sys.stderr)
            return 1
        d = max(abs(a - b) for a, b in zip(e, g))
        max_diff = max(max_diff, d)
        rows_ok += d <= tol * max(abs(v) for v in e)
        argmax_ok += max(range(vocab), key=e.__getitem__) == max(range(vocab), key=g.__getitem__)
    rel = max_diff / max_abs
    ok = rel <= tol and argmax_ok >= argmax_bound * rows
    print(f"{argv[1]}: max|d|/max|logit| {100 * rel:.2f}%  rows within {100 * tol:g}%: {rows_ok}/{rows}  "
          f"argmax agree: {argmax_ok}/{rows}  -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, ValueError, KeyError) as e:
        print(f"compare_logits: {e}", file=sys.stderr)
        sys.exit(2)
