#!/usr/bin/env python3
"""Checks that every include in the engine points down the layer stack (docs/architecture.md).

Each source file (.h .hpp .cpp .cc .cu .cuh) under src/ and bench/ belongs to one room; each room
sits on one floor. A file may include from its own room, from another room of a lower floor, or
from a room of the same floor that the table below lets it see (siblings are otherwise blind to
each other: the CPU and CUDA backends never include one another). The room graph must have no
cycle. Prints every offending include as `file:line: include "x" (room a, floor N) -> room b
(floor M)` and exits 1; prints a one-line summary and exits 0 when the tree is layered.

Usage: tools/check_layers.py [REPO_ROOT]
       tools/check_layers.py --self-test   (the checker on small made-up trees: it must pass a layered
                                            one and catch an upward include and a cycle)
"""
import os
import re
import sys

# (room, path prefix, floor). The longest matching prefix names a file's room.
ROOMS = [
    ("common", "src/common/", 0),
    ("ops", "src/ops/", 1),
    ("comm", "src/comm/", 1),
    ("io", "src/io/", 2),
    ("tokenizer", "src/tokenizer/", 3),
    ("quant", "src/quant/", 3),
    ("sampling", "src/sampling/", 3),
    ("chat", "src/chat/", 4),
    ("grammar", "src/grammar/", 4),
    ("model", "src/model/", 5),
    ("seam", "src/seam/", 6),
    ("backend-shared", "src/backend/", 7),  # files directly in src/backend/: what both backends share
    ("backend-cpu", "src/backend/cpu/", 8),
    ("backend-cuda", "src/backend/cuda/", 8),
    ("factory", "src/factory/", 9),
    ("runtime", "src/runtime/", 10),
    ("serve", "src/serve/", 11),
    ("bench", "bench/", 11),
    ("cli", "src/cli/", 12),
]
# Same-floor rooms that may include each other in the direction given (still no cycle allowed).
SAME_FLOOR_OK = set()

SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def room_of(rel):
    best = None
    for name, prefix, floor in ROOMS:
        if rel.startswith(prefix):
            rest = rel[len(prefix):]
            # "src/backend/" owns only the files directly inside it.
            if name == "backend-shared" and "/" in rest:
                continue
            if best is None or len(prefix) > len(best[1]):
                best = (name, prefix, floor)
    return best


def resolve(root, including_rel, inc):
    """The repository path an include names: relative to the including file, else to src/ or the root."""
    here = os.path.dirname(including_rel)
    for base in (here, "src", ""):
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def find_cycle(edges):
    """One cycle of the room graph as a list of rooms, or None."""
    color, stack = {}, []

    def visit(u):
        color[u] = 1
        stack.append(u)
        for v in sorted(edges.get(u, ())):
            if color.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if color.get(v) is None:
                c = visit(v)
                if c:
                    return c
        stack.pop()
        color[u] = 2
        return None

    for u in sorted(edges):
        if color.get(u) is None:
            c = visit(u)
            if c:
                return c
    return None


def check(root):
    """The problems of the tree at root (empty when it is layered) and the number of files read."""
    problems, edges, files = [], {}, 0
    for top in ("src", "bench"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for n in sorted(names):
                if not n.endswith(SOURCE_EXT):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, n), root)
                me = room_of(rel)
                if me is None:
                    problems.append(f"{rel}: in no room of the layer table (tools/check_layers.py)")
                    continue
                files += 1
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                    for i, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = resolve(root, rel, m.group(1))
                        if target is None:
                            continue  # a system or generated header
                        them = room_of(target)
                        if them is None or them[0] == me[0]:
                            continue
                        edges.setdefault(me[0], set()).add(them[0])
                        up = them[2] > me[2] or (them[2] == me[2] and (me[0], them[0]) not in SAME_FLOOR_OK)
                        if up:
                            problems.append(f'{rel}:{i}: include "{m.group(1)}" (room {me[0]}, floor {me[2]}) -> '
                                            f"room {them[0]} (floor {them[2]})")
    cycle = find_cycle(edges)
    if cycle:
        problems.append("rooms include each other in a circle: " + " -> ".join(cycle))
    return problems, files


def self_test():
    import tempfile

    def tree(files):
        d = tempfile.mkdtemp(prefix="check_layers_")
        for rel, text in files.items():
            os.makedirs(os.path.join(d, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(d, rel), "w") as f:
                f.write(text)
        return d

    good = {"src/common/error.h": "", "src/model/config.h": '#include "common/error.h"\n',
            "src/backend/cpu/x.cpp": '#include "model/config.h"\n#include "backend/step.h"\n',
            "src/backend/step.h": '#include "model/config.h"\n'}
    up = dict(good, **{"src/model/config.h": '#include "backend/cpu/x.h"\n', "src/backend/cpu/x.h": ""})
    sib = dict(good, **{"src/backend/cuda/y.h": '#include "backend/cpu/x.cpp"\n'})
    cyc = dict(good, **{"src/io/a.h": '#include "io/b.h"\n', "src/io/b.h": "",
                        "src/tokenizer/t.h": '#include "chat/c.h"\n', "src/chat/c.h": '#include "tokenizer/t.h"\n'})
    results = [check(tree(good))[0] == [],
               any("room backend-cpu" in p for p in check(tree(up))[0]),
               any("room backend-cpu (floor 8)" in p for p in check(tree(sib))[0]),
               any("circle" in p for p in check(tree(cyc))[0])]
    print("check_layers self-test:", "ok" if all(results) else f"FAILED {results}")
    return 0 if all(results) else 1


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    if not os.path.isdir(os.path.join(root, "src")):
        print(f"check_layers: {root} has no src/ (usage: tools/check_layers.py [REPO_ROOT] | --self-test)")
        return 2
    problems, files = check(root)
    if problems:
        print("\n".join(problems))
        print(f"check_layers: {len(problems)} problem(s) in {files} files")
        return 1
    print(f"check_layers: {files} files in {len(ROOMS)} rooms: every include points down, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
