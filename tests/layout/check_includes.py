#!/usr/bin/env python3
"""Fail when a source file includes a header of a layer above its own (or beside it).

Usage: check_includes.py ROOT

hora's layers, bottom up (each folder's README says the same in words):

  kernels                 host and CUDA kernels         may include: kernels, public
  runtime/core            context, log, params, CRC     may include: core, public
  runtime/ckpt|data|trace services on core              may include: core, itself, kernels, public
  runtime/algo            host collectives              may include: core, algo, kernels, public
  runtime/comm            device collectives            may include: core, algo, comm, kernels, public
  runtime/engine          async engine                  may include: core, algo, engine, kernels, public
  runtime/init            hora_init / hora_finalize     may include: every runtime module
  runtime/tools           hora-bench, hora-info, ...    may include: every runtime module, tools
  launch                  the launcher                  may include: launch, public

"public" is runtime/include (hora.h and the generated hora/config.h, hora/version.h). Only quoted
includes are checked; system headers (<mpi.h>, <cuda_runtime.h>) are the READMEs' business. A
quoted include that resolves to no known layer is an error too, so that a new header gets a place.
Prints one line per violation and exits 1 if there is one, 0 otherwise.
"""
import os
import re
import sys

SERVICES = {'ckpt', 'data', 'trace'}
RUNTIME = {'core', 'algo', 'comm', 'engine', 'init'} | SERVICES
ALLOWED = {
    'kernels': {'kernels', 'public'},
    'core': {'core', 'public'},
    'algo': {'core', 'algo', 'kernels', 'public'},
    'comm': {'core', 'algo', 'comm', 'kernels', 'public'},
    'engine': {'core', 'algo', 'engine', 'kernels', 'public'},
    'init': RUNTIME | {'kernels', 'public'},
    'tools': RUNTIME | {'tools', 'kernels', 'public'},
    'launch': {'launch', 'public'},
}
for s in SERVICES:
    ALLOWED[s] = {'core', s, 'kernels', 'public'}
GENERATED_PUBLIC = {'hora/config.h', 'hora/version.h'}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(root, path):
    """The layer a file under root belongs to, or None when it is not checked."""
    parts = os.path.relpath(path, root).split(os.sep)
    if parts[0] == 'kernels':
        return 'kernels'
    if parts[0] == 'launch':
        return 'launch'
    if parts[0] == 'runtime' and len(parts) > 2:
        if parts[1] == 'include':
            return 'public'
        if parts[1] in RUNTIME or parts[1] == 'tools':
            return parts[1]
    return None


def resolve(root, src, inc):
    """The layer of the header `inc` included from `src`, or None if it cannot be placed."""
    here = os.path.join(os.path.dirname(src), inc)
    if os.path.exists(here):
        return layer_of(root, os.path.abspath(here))
    if inc in GENERATED_PUBLIC:
        return 'public'
    for base in ('runtime', 'runtime/include', 'kernels/include'):
        p = os.path.join(root, base, inc)
        if os.path.exists(p):
            return layer_of(root, os.path.abspath(p))
    return None


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1])
    bad = files = 0
    for top in ('kernels', 'runtime', 'launch'):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for f in sorted(filenames):
                if not f.endswith(('.c', '.h', '.cu', '.cuh')):
                    continue
                src = os.path.join(dirpath, f)
                mine = layer_of(root, src)
                if mine is None or mine == 'public':
                    continue
                files += 1
                with open(src, encoding='utf-8', errors='replace') as fh:
                    text = fh.read()
                for m in INCLUDE.finditer(text):
                    inc = m.group(1)
                    line = text.count('\n', 0, m.start()) + 1
                    theirs = resolve(root, src, inc)
                    rel = os.path.relpath(src, root)
                    if theirs is None:
                        print(f'{rel}:{line}: "{inc}" is in no known layer (add it to check_includes.py)')
                        bad += 1
                    elif theirs not in ALLOWED[mine]:
                        print(f'{rel}:{line}: "{inc}" ({theirs}) is not below {mine}: '
                              f'{mine} may include {", ".join(sorted(ALLOWED[mine]))}')
                        bad += 1
    if files == 0:
        print('check_includes: no source files found: wrong root?', file=sys.stderr)
        return 2
    print(f'check_includes: {files} files, {bad} include{"s" if bad != 1 else ""} against the layering')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
