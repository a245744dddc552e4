"""Count one request's walk through the workspace's source files, from
`uftrace replay -f time,tid` of a build with mcount calls (scripts/dev/walk.sh
records one and runs this).

usage: walk_count.py REPLAY BINARY ROOT

The request counted is the trace's last burst: the events after the last
pause of more than half a second (walk.sh waits 2 s before the traced request).

Every function event (entered, a leaf called, returned from) places the walk
in a file: the entered function's file, or on a return the file of the
function returned to (that thread's caller). A function's file comes from its
DWARF line info (nm for the address, addr2line for the file). Only files
under ROOT/crates/ count; events in other code leave the walk where it was.
A move is a change of file between consecutive counted events in time order
(all threads); a return is a move into a file the walk has already left. A
distinct call is a pair (calling function, called function) in two files of
the workspace, counted once however often it is made. Printed: the counts,
each file's entries, and the 20 most frequent moves (from -> to).
"""
import re
import subprocess
import sys
from collections import Counter

LINE = re.compile(r'^\s*\[\s*(\d+)\]\s+([\d.]+) \|(\s*)(.*)$')


def last_burst(path):
    """The line where the trace's last burst begins."""
    first, previous = 1, None
    with open(path, errors='replace') as f:
        for n, raw in enumerate(f, 1):
            m = LINE.match(raw)
            if not m:
                continue
            t = float(m[2])
            if previous is not None and t - previous > 0.5:
                first = n
            previous = t
    return first


def events(path, first):
    with open(path, errors='replace') as f:
        for n, raw in enumerate(f, 1):
            if n < first:
                continue
            m = LINE.match(raw)
            if not m:
                continue
            body = m[4].rstrip()
            if body.startswith('} /* '):
                yield m[1], 'exit', body[5:-3].strip()
            elif body.endswith('() {'):
                yield m[1], 'enter', body[:-4]
            elif body.endswith('();'):
                yield m[1], 'leaf', body[:-3]


def files_of(binary, names, root):
    addrs = {}
    nm = subprocess.run(['nm', binary], capture_output=True, text=True).stdout
    for line in nm.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] in names:
            addrs[parts[2]] = parts[0]
    order = list(addrs)
    out = subprocess.run(['addr2line', '-e', binary] + [addrs[n] for n in order],
                         capture_output=True, text=True).stdout.splitlines()
    files = {}
    marker = root.rstrip('/') + '/crates/'
    for name, where in zip(order, out):
        path = where.split(':', 1)[0]
        # The allocator's shims are placed at the #[global_allocator] line.
        if '___rust_' in name or '__rust_alloc' in name or '__rg_' in name:
            continue
        if path.startswith(marker):
            files[name] = path[len(marker):]
    return files


def main(replay, binary, root):
    evs = list(events(replay, last_burst(replay)))
    names = {e[2] for e in evs}
    files = files_of(binary, names, root)
    # A thread's stack: per frame, the frame's file (None outside the
    # workspace) and the workspace function nearest above it.
    stacks = {}
    edges = set()
    walk = []
    for tid, kind, name in evs:
        stack = stacks.setdefault(tid, [])
        f = files.get(name) if kind != 'exit' else None
        caller = stack[-1][1] if stack else None
        if f and caller and caller[0] != f:
            edges.add((caller, (f, name)))
        if kind == 'enter':
            stack.append((f, (f, name) if f else caller))
            walk.append(f)
            continue
        if kind == 'leaf':
            walk.append(f)
        elif stack:
            stack.pop()
        walk.append(stack[-1][0] if stack else None)
    moves = returns = 0
    left = set()
    entered = Counter()
    pairs = Counter()
    prev = None
    for f in walk:
        if f is None or f == prev:
            continue
        if prev is not None:
            moves += 1
            pairs[(prev, f)] += 1
            left.add(prev)
            if f in left:
                returns += 1
        entered[f] += 1
        prev = f
    print(f"files entered: {len(entered)}; moves between files: {moves}; "
          f"returns to a file already left: {returns}")
    print(f"distinct calls from one file's function into another file's: {len(edges)}")
    for f, n in entered.most_common():
        print(f"  {n:4d}  {f}")
    print("the most frequent moves:")
    for (a, b), n in pairs.most_common(20):
        print(f"  {n:4d}  {a} -> {b}")


if __name__ == '__main__':
    main(*sys.argv[1:])
