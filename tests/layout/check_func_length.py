#!/usr/bin/env python3
"""Fail when a C function in the given folders is longer than the limit (default 120 lines).

Usage: check_func_length.py [--max N] ROOT DIR...   (DIRs relative to ROOT; .c and .h files)

A simple scanner, not a C parser: comments, string and character literals and preprocessor lines
are blanked out, then every top-level `{ ... }` block whose text before the `{` ends with `)` is a
function. Its length runs from the line of its name to the line of its closing brace, both
included. Prints one line per long function (file:line: name: N lines) and exits 1 if there is
one, 0 otherwise.
"""
import os
import re
import sys


def blank(text):
    """Replace comments, literals and preprocessor lines by spaces, keeping newlines."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == '#':
            # Preprocessor line, with backslash continuations.
            while i < n and text[i] != '\n':
                if text[i] == '\\' and i + 1 < n and text[i + 1] == '\n':
                    out.append(' \n')
                    i += 2
                    continue
                out.append(' ')
                i += 1
            continue
        if c == '\n':
            out.append(c)
            at_line_start = True
            i += 1
            continue
        if c in ' \t':
            out.append(c)
            i += 1
            continue
        at_line_start = False
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r'[^\n]', ' ', text[i + 1:j - 1]) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def functions(text):
    """Yield (name, first_line, last_line) for every function definition in C source text."""
    code = blank(text)
    depth = 0
    chunk_start = 0  # offset where the current top-level declaration starts
    open_at = None
    for i, c in enumerate(code):
        if c == '{':
            if depth == 0:
                open_at = i
            depth += 1
        elif c == '}':
            depth -= 1
            if depth == 0:
                head = code[chunk_start:open_at].rstrip()
                if head.endswith(')') and '=' not in head.split('(')[0]:
                    m = re.search(r'([A-Za-z_]\w*)\s*\(', head)
                    name = m.group(1) if m else '?'
                    # The name's line: skip attribute/return-type lines above it.
                    name_off = chunk_start + (m.start(1) if m else 0)
                    yield (name, code.count('\n', 0, name_off) + 1, code.count('\n', 0, i) + 1)
                chunk_start = i + 1
            elif depth < 0:
                depth = 0
                chunk_start = i + 1
        elif c == ';' and depth == 0:
            chunk_start = i + 1


def main(argv):
    limit = 120
    if len(argv) > 1 and argv[1] == '--max':
        limit = int(argv[2])
        argv = argv[:1] + argv[3:]
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    root, bad, scanned = argv[1], 0, 0
    for d in argv[2:]:
        top = os.path.join(root, d)
        if not os.path.isdir(top):
            print(f'check_func_length: {top}: not a folder', file=sys.stderr)
            return 2
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for f in sorted(filenames):
                if not f.endswith(('.c', '.h')):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding='utf-8', errors='replace') as fh:
                    text = fh.read()
                for name, first, last in functions(text):
                    scanned += 1
                    lines = last - first + 1
                    if lines > limit:
                        print(f'{os.path.relpath(path, root)}:{first}: {name}: {lines} lines '
                              f'(limit {limit}): split it')
                        bad += 1
    if scanned == 0:
        print('check_func_length: no functions found: wrong folders?', file=sys.stderr)
        return 2
    print(f'check_func_length: {scanned} functions, {bad} over {limit} lines')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
