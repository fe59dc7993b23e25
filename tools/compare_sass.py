#!/usr/bin/env python3
"""Compares every CUDA kernel of two builds: SASS and resource usage (registers, shared, constant bytes).

The check for a refactor that must not change a kernel ("a move, not a rewrite"). For each *.cu.o under the
two object folders (e.g. build/CMakeFiles/clawmine_core.dir of each build), `cuobjdump -sass` and
`cuobjdump -res-usage` per kernel; kernels are matched by object file and demangled name, anonymous-namespace
hashes removed, instruction addresses dropped (encodings kept). RENAME maps kernels a change renamed (old
demangled name pattern -> new). Prints the kernels that differ or exist on one side, then
`kernels: N identical / M`; exit status 1 unless all are identical.

Needs cuobjdump and nvdisasm on PATH (the CUDA toolkit's, or pip's nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm) and c++filt.
Usage: tools/compare_sass.py OLD_OBJ_DIR NEW_OBJ_DIR [--regs]
"""
import os
import re
import subprocess
import sys

# The decode kernels of the weight-format linears became one template over the format (linear/sm90_decode.cuh).
RENAME = [
    (r'cm::cuda::ANON::(fp8|nvfp4)_decode_kernel<(\d+), (true|false)>\((.*)\)',
     lambda m: f'cm::cuda::sm90::decode_kernel<cm::cuda::ANON::{FMT[m.group(1)]}, {m.group(2)}, {m.group(3)}>({m.group(4)})'),
    (r'cm::cuda::ANON::(fp8|nvfp4)_decode_pair_kernel<(\d+)>\((.*)\)',
     lambda m: f'cm::cuda::sm90::decode_pair_kernel<cm::cuda::ANON::{FMT[m.group(1)]}, {m.group(2)}>({m.group(3)})'),
]
FMT = {'fp8': 'Fp8Format', 'nvfp4': 'Nvfp4Format'}
PARAMS = {'ANON::Fp8Format::Params': 'ANON::Fp8DecodeParams', 'ANON::Nvfp4Format::Params': 'ANON::DecodeParams'}
ANON = re.compile(r'_GLOBAL__N__[0-9A-Za-z_]+?_(?=\d)')


def run(*cmd, stdin=None):
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True).stdout


def norm_name(d):
    d = re.sub(r'^void ', '', d.replace('(anonymous namespace)', 'ANON'))
    for a, b in PARAMS.items():
        d = d.replace(a, b)
    for pat, rep in RENAME:
        m = re.fullmatch(pat, d)
        if m:
            d = rep(m)
    return d


def kernels(objdir):
    sass, regs, where = {}, {}, {}
    for root, _, files in os.walk(objdir):
        for f in sorted(files):
            if not f.endswith('.cu.o'):
                continue
            p = os.path.join(root, f)
            cur = None
            for line in run('cuobjdump', '-sass', p).split('\n'):
                m = re.match(r'\s*Function : (\S+)', line)
                if m:
                    cur = m.group(1)
                    sass[cur], where[cur] = [], os.path.relpath(p, objdir)
                elif cur and line.strip() and not line.strip().startswith('.'):
                    sass[cur].append(ANON.sub('ANON_', re.sub(r'/\*[0-9a-f]{4,}\*/', '', line).strip()))
            lines = run('cuobjdump', '-res-usage', p).split('\n')
            for i, line in enumerate(lines[:-1]):
                m = re.match(r'\s*Function (\S+):', line)
                if m:
                    regs[m.group(1)] = lines[i + 1].strip()
    names = list(sass)
    demangled = run('c++filt', stdin='\n'.join(names)).split('\n')
    return {f'{where[k]} :: {norm_name(d)}': (sass[k], regs.get(k, '?')) for k, d in zip(names, demangled)}


def main():
    old, new = kernels(sys.argv[1]), kernels(sys.argv[2])
    same = 0
    for n in sorted(set(old) | set(new)):
        if n not in old or n not in new:
            print('only in', 'new:' if n not in old else 'old:', n)
        elif old[n] == new[n]:
            same += 1
            if '--regs' in sys.argv:
                print(new[n][1].split(' STACK')[0], n)
        else:
            print('DIFFERS:', n, '| old', old[n][1], '| new', new[n][1])
    total = len(set(old) | set(new))
    print(f'kernels: {same} identical / {total} (old {len(old)}, new {len(new)})')
    sys.exit(0 if same == total else 1)


if __name__ == '__main__':
    main()
