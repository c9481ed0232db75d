#!/usr/bin/env python3
"""Layering check for src/ (CI): the includes must point down.

Reads every `#include "..."` under src/ (C, CUDA, headers) and fails when
  1. a file includes a header of a higher layer (RANK below: the speculative
     loop, speculate/, sits above backend/, model/ and draft/, which sit above the
     sampling math and the basics), or a folder has no layer yet, or
  2. the file graph has a cycle. A node is a file's stem: x.c, x.cu and x.h
     are one node "x", since a header and its implementation are one module,
     so "a.c includes b.h and b.c includes a.h" is a circle.
Standard library only. Exit status 0: clean; 1: violations, each printed.
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
# The layers, bottom up; a file may include its own layer and those below.
# io/ and tokenizer/ use each other's files (prompt files, tokenizer.json), so share one.
RANK = {"base": 0, "io": 1, "tokenizer": 1, "sample": 1, "backend": 2, "model": 3, "draft": 4, "speculate": 5, "batch": 6,
        "train": 7, "api": 8, "serve": 9}
EXTS = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def node(path):
    """The module a file belongs to: its path under src/ without the extension."""
    return os.path.splitext(path)[0]


def scan(src):
    """{file under src/: [resolved includes under src/]}. Includes are relative to
    src/ (the project's include root) or, failing that, to the including file's folder."""
    files = {}
    for root, _, names in os.walk(src):
        for name in names:
            if name.endswith(EXTS):
                rel = os.path.relpath(os.path.join(root, name), src).replace(os.sep, "/")
                files[rel] = None
    for rel in files:
        with open(os.path.join(src, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        deps = []
        for inc in INCLUDE.findall(text):
            local = os.path.normpath(os.path.join(os.path.dirname(rel), inc)).replace(os.sep, "/")
            if inc in files:
                deps.append(inc)
            elif local in files:
                deps.append(local)
            # anything else is outside src/ (include/, system headers): not our graph
        files[rel] = deps
    return files


def find_cycles(graph):
    """Every strongly connected component with more than one node (or a self
    loop), each reported as one concrete cycle through it. Tarjan, iterative."""
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in graph[v]:
                        comps.append(sorted(comp))
    cycles = []
    for comp in comps:
        members = set(comp)
        # shortest path from comp[0] back to itself inside the component (BFS)
        first = comp[0]
        prev, frontier, found = {}, [first], None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w not in members:
                        continue
                    if w == first:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path, v = [first], found
        while v != first:
            path.append(v)
            v = prev[v]
        path.append(first)
        path = [path[0]] + path[1:-1][::-1] + [first]
        cycles.append(path)
    return cycles


def main():
    src = os.path.normpath(SRC)
    files = scan(src)
    problems = []

    for rel in sorted(files):
        top = rel.split("/", 1)[0]
        if top not in RANK:
            problems.append(f"src/{rel}: folder {top}/ has no layer (add it to RANK in {os.path.basename(__file__)})")
            continue
        for dep in files[rel]:
            up = dep.split("/", 1)[0]
            if RANK.get(up, -1) > RANK[top]:
                problems.append(f"upward include: src/{rel} includes {dep} ({top}/ is below {up}/)")

    graph = {}
    for rel, deps in files.items():
        graph.setdefault(node(rel), set())
        for dep in deps:
            if node(dep) != node(rel):  # x.c including x.h is the module itself
                graph[node(rel)].add(node(dep))
    for dep_set in list(graph.values()):
        for d in dep_set:
            graph.setdefault(d, set())
    for cycle in find_cycles(graph):
        problems.append("include circle: " + " -> ".join(cycle))

    for p in problems:
        print(p)
    n_edges = sum(len(v) for v in graph.values())
    if problems:
        print(f"check_layers: {len(problems)} problem(s) in {len(files)} files ({len(graph)} modules, {n_edges} edges)")
        return 1
    order = " < ".join("/".join(sorted(k for k in RANK if RANK[k] == r)) for r in sorted(set(RANK.values())))
    print(f"check_layers: ok: {len(files)} files, {len(graph)} modules, {n_edges} edges; "
          f"includes point down ({order}), no include circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
