#!/usr/bin/env python3
"""The last traced decode step of a DS_CUDA_RING_TRACE file as a table.

    DS_CUDA_RING_TRACE=/tmp/ring.txt ./build-cuda/dspark bench --backend cuda -m MODEL --decode 8 --reps 1
    python3 bench/ring_timeline.py /tmp/ring.txt [--rows M] [--first I] [--count N] [--by-entry] [--summary | --attention-blocks]

A step is the ring launches from one LM head (the launch with the most
tiles) to the next, of calls with M rows (default 1): the last such
step with no launch of other row counts among its launches. Times are us from the
step's first block entry; per launch: blocks' entry (first..last), the
consumers' wait for the previous kernel returning (first..last), the first
stage of the slowest block, the blocks' ends (first..last), the median time
between a block's tiles, and the producer's last request -> block end.
Fields per block are those of src/backend/cuda/ring_trace.h (older traces
without the prologue's fields print "-" for them).

The attention and q/k norm + RoPE launches between the matmuls are listed
too (K column "attn" / "norm"; tiles: their blocks): for attention "first"
is the slowest block's end of its prologue (its key loop starts), "tile" the
median key loop (prologue end -> keys done, where it lets the next kernel
in), "drain" the median keys done -> block end (the merge and stores).

--by-entry adds, per launch, its blocks in four groups by entry time (medians:
entry, wait, first stage, wait -> first stage, first and second tile's
durations, end, tiles): a block that entered early and still reaches its
first stage late, or whose prefetched first tile takes as long as a later
one, points at what gates the stream (session 9's in-flight cap was found
this way); and when the producer had requested its ring once through and
when that landed (us after entry), and, where traced, when thread 0 had each
of its first stages and how long it waited for them in all.
--attention-blocks prints, instead, two attention launches per row count (1,
7, 8) and a q/k norm launch before one, per block: quantiles of entry,
wait, prologue, key loop, drain and end, us from the matmul before them.
--draft takes, instead of a decode step, a drafted run's last draft: the
launches after a verify's LM head (8 rows) up to the drafter's LM head (7
rows) or, where the draft's head is bounded, its walk; any row count (the context append's, the block's); --summary then
names each kind with its rows.
--walk prints, instead, the greedy draft's head (markov_greedy_head) over
every traced draft: the bounds kernel (its blocks' wait and end), the
boundary to the walk, the walk's prologue, and per step the medians over
blocks of its three phases — e gathered + the bounds -> candidates listed,
the candidates' exact rows + scan -> best posted (also the slowest block's),
the grid barrier + merge -> token known — then the medians over drafts.
--summary prints, instead of the table, the step's critical path by kind of
launch (matmul K/tiles, attn, norm): per launch the time from the previous
launch's last block end to this one's (its span), split into the wait for
the previous kernel to return and wait -> last end; summed over the step.
Comparing --rows 1 with --rows 8 shows where a verify pays over decode."""
import argparse
import collections
import statistics

ap = argparse.ArgumentParser()
ap.add_argument("file")
ap.add_argument("--rows", type=int, default=1)
ap.add_argument("--first", type=int, default=0)
ap.add_argument("--count", type=int, default=1000)
ap.add_argument("--by-entry", action="store_true")
ap.add_argument("--summary", action="store_true")
ap.add_argument("--draft", action="store_true")
ap.add_argument("--attention-blocks", action="store_true")
ap.add_argument("--walk", action="store_true")
a = ap.parse_args()

blocks = collections.defaultdict(list)
meta = {}
for line in open(a.file):
    v = [int(x) for x in line.split()]
    slot, m, k, tiles, _b, t = v[0], v[1], v[2], v[3], v[4], v[5:]
    if t[0] and t[3]:  # entered and finished
        blocks[slot].append(t)
        meta[slot] = (m, k, tiles)
entry = lambda s: min(t[0] for t in blocks[s])
everything = sorted(blocks, key=entry)
if a.attention_blocks:  # two attention launches per row count 1 / 7 / 8, per block, from the matmul before them
    def q(xs):
        xs = sorted(xs)
        return "%5.2f %5.2f %5.2f %5.2f" % (xs[0], xs[len(xs) // 4], xs[len(xs) // 2], xs[-1])
    print("attention launches (and a q/k norm launch before one), per block (min / q1 / median / max, us;")
    print("t0 = the last block end of the matmul before them)")
    for m in (1, 7, 8):
        idx = [i for i, s in enumerate(everything) if meta[s][0] == m and meta[s][1] == -1]
        for i in idx[-12:-11] + idx[-4:-3]:
            j = i - 1 if meta[everything[i - 1]][1] != -2 else i - 2  # the matmul (QKV) before them
            t0 = max(t[3] for t in blocks[everything[j]])
            for s in everything[j + 1:i + 1]:
                B = blocks[s]
                rel = lambda f: q([(f(t) - t0) / 1e3 for t in B])
                if meta[s][1] == -2:
                    print("rows %d, norm %d blocks: entry %s | wait %s | end %s" % (
                        m, len(B), rel(lambda t: t[0]), rel(lambda t: t[1]), rel(lambda t: t[3])))
                    continue
                print("rows %d, attention %d blocks: entry %s | wait %s | prologue %s | keys %s | drain %s | end %s" % (
                    m, len(B), rel(lambda t: t[0]), rel(lambda t: t[1]), q([(t[2] - t[1]) / 1e3 for t in B]),
                    q([(t[4] - t[2]) / 1e3 for t in B]), q([(t[3] - t[4]) / 1e3 for t in B]), rel(lambda t: t[3])))
                if all(t[16] for t in B):  # the fused prologue's steps (ring_trace.h: RT_TILE0 6, RT_NW 16 ..)
                    print("    fused prologue from the wait: positions %s | rows %s | normed %s | synced %s" % (
                        q([(t[6] - t[1]) / 1e3 for t in B]), q([(t[16] - t[1]) / 1e3 for t in B]),
                        q([(t[17] - t[1]) / 1e3 for t in B]), q([(t[18] - t[1]) / 1e3 for t in B])))
    raise SystemExit(0)
if a.walk:  # ring_trace.h: RT_KIND_HEAD_WALK -3 / RT_KIND_HEAD_BOUNDS -4; step s's fields at 6 + 3 s
    med = statistics.median
    rows = collections.defaultdict(list)
    for i, s in enumerate(everything):
        if meta[s][1] != -3:
            continue
        B, G = blocks[s], meta[s][0]
        j = max((k for k in range(i) if meta[everything[k]][1] == -4), default=None)
        if j is not None:
            HB = blocks[everything[j]]
            b_end = max(t[3] for t in HB)
            rows["bounds: wait -> last end"].append((b_end - med(t[1] for t in HB)) / 1e3)
            rows["bounds end -> walk wait (last block)"].append((max(t[1] for t in B) - b_end) / 1e3)
        rows["walk prologue (wait -> first)"].append(med((t[2] - t[1]) / 1e3 for t in B))
        for st in range(min(G, 8)):
            f = 6 + 3 * st
            start = lambda t: t[2] if st == 0 else t[f - 1]
            rows["step %d bounds" % st].append(med((t[f] - start(t)) / 1e3 for t in B))
            rows["step %d exact rows (median)" % st].append(med((t[f + 1] - t[f]) / 1e3 for t in B))
            rows["step %d exact rows (slowest)" % st].append(max((t[f + 1] - t[f]) / 1e3 for t in B))
            rows["step %d barrier + merge" % st].append(med((t[f + 2] - t[f + 1]) / 1e3 for t in B))
            rows["step %d whole" % st].append(med((t[f + 2] - start(t)) / 1e3 for t in B))
        rows["walk: wait -> last end"].append((max(t[3] for t in B) - min(t[1] for t in B)) / 1e3)
    if not rows:
        raise SystemExit("no head walk traced (a greedy draft with the head bound: DS_CUDA_HEAD_BOUND)")
    print("the greedy draft's head, us (median over %d drafts; each a median over blocks unless marked)" %
          len(rows["walk prologue (wait -> first)"]))
    for name, v in rows.items():
        print("  %-40s %8.2f   (min %.2f, max %.2f)" % (name, med(v), min(v), max(v)))
    raise SystemExit(0)
def lm_heads(ls):
    """Indices in ls of the LM heads: the matmul launches with the most tiles."""
    most = max(meta[s][2] for s in ls if meta[s][1] > 0)
    return [i for i, s in enumerate(ls) if meta[s][1] > 0 and meta[s][2] == most]


if a.draft:  # a verify's LM head (8 rows) -> the next drafter LM head (7 rows), every launch between them
    heads = lm_heads(everything)
    # a draft ends at the drafter's LM head (7 rows), or at its head walk where the head is bounded (K -3)
    ends = sorted({h for h in heads if meta[everything[h]][0] == 7} |
                  {i for i, s in enumerate(everything) if meta[s][1] == -3})
    pairs = [(h0, min(e for e in ends if e > h0)) for h0 in heads
             if meta[everything[h0]][0] == 8 and any(e > h0 for e in ends)]
    if not pairs:
        raise SystemExit("no verify LM head (8 rows) followed by a drafter LM head (7 rows) or head walk")
    h0, h1 = pairs[-1]
    step = everything[h0:h1 + 1]
    rows = "8 -> 7 (a draft)"
else:
    launches = [s for s in everything if meta[s][0] == a.rows]
    if not launches:
        raise SystemExit("no traced launch with %d rows" % a.rows)
    heads = lm_heads(launches)
    if len(heads) < 2:
        raise SystemExit("fewer than two LM heads traced: decode more tokens")
    # The last pair of LM heads whose step's launches ran with nothing of other row counts among them (a drafted
    # run's 1-row drafter calls sit between far-apart 1-row heads, with verifies and blocks among them: no step).
    where = {s: i for i, s in enumerate(everything)}
    for h0, h1 in reversed(list(zip(heads, heads[1:]))):
        step = launches[h0 + 1:h1 + 1]
        # (two heads with nothing between them, as a prefill's chunk ends may give, are no step)
        if len(step) > 2 and where[step[-1]] - where[step[0]] == len(step) - 1:
            break
    else:
        raise SystemExit("no two LM heads of %d rows with only %d-row launches between them" % (a.rows, a.rows))
    rows = str(a.rows)
t0 = min(t[0] for t in blocks[step[0]])
us = lambda x: (x - t0) / 1e3
print("step of %d launches, %.1f us; rows %s" % (len(step), us(max(t[3] for t in blocks[step[-1]])), rows))
if a.summary:
    kinds = collections.OrderedDict()
    for prev, s in zip(step, step[1:]):
        m, k, tiles = meta[s]
        name = {-1: "attn", -2: "norm", -3: "walk", -4: "bounds"}.get(k, "%d/%d" % (k, tiles))
        if a.draft:
            name += " x%d" % m
        prev_end = max(t[3] for t in blocks[prev])
        end, wait = max(t[3] for t in blocks[s]), max(t[1] for t in blocks[s])
        kinds.setdefault(name, []).append(((end - prev_end) / 1e3, (wait - prev_end) / 1e3, (end - wait) / 1e3))
    print("%-12s %5s %10s %10s %10s %9s" % ("kind", "n", "span", "->wait", "wait->end", "total"))
    total = 0.0
    for name, v in kinds.items():
        n, span = len(v), sum(x[0] for x in v)
        total += span
        print("%-12s %5d %10.2f %10.2f %10.2f %9.1f" % (name, n, span / n, statistics.mean(x[1] for x in v),
                                                    statistics.mean(x[2] for x in v), span))
    print("%-12s %5s %10s %10s %10s %9.1f" % ("all", "", "", "", "", total))
    raise SystemExit(0)
print("%4s %6s %6s  %-15s %-15s %7s %-15s %7s %7s" % ("#", "K", "tiles", "entry", "wait", "first", "end", "tile", "drain"))
for i, s in enumerate(step[a.first:a.first + a.count], a.first):
    B = blocks[s]
    m, k, tiles = meta[s]
    if k < 0:  # attention (-1) or the q/k norm + RoPE kernel (-2): no tiles
        attn = k == -1
        first = us(max(t[2] for t in B)) if attn else 0.0
        loop = statistics.median(t[4] - t[2] for t in B) / 1e3 if attn else 0.0
        drain = statistics.median(t[3] - t[4] for t in B) / 1e3 if attn else 0.0
        print("%4d %6s %6d  %6.1f..%-7.1f %6.1f..%-7.1f %7.1f %6.1f..%-7.1f %7.2f %7.2f" % (
            i, {-1: "attn", -2: "norm", -3: "walk", -4: "bounds"}.get(k, "?"), len(B), us(min(t[0] for t in B)), us(max(t[0] for t in B)),
            us(min(t[1] for t in B)), us(max(t[1] for t in B)), first, us(min(t[3] for t in B)),
            us(max(t[3] for t in B)), loop, drain))
        continue
    gaps = [t[6 + j + 1] - t[6 + j] for t in B for j in range(min(t[5], 10) - 1)]
    print("%4d %6d %6d  %6.1f..%-7.1f %6.1f..%-7.1f %7.1f %6.1f..%-7.1f %7.2f %7.2f" % (
        i, k, tiles, us(min(t[0] for t in B)), us(max(t[0] for t in B)), us(min(t[1] for t in B)),
        us(max(t[1] for t in B)), us(max(t[2] for t in B)), us(min(t[3] for t in B)), us(max(t[3] for t in B)),
        statistics.median(gaps) / 1e3 if gaps else 0, statistics.median(t[3] - t[4] for t in B) / 1e3))
    if a.by_entry:
        B = sorted(B, key=lambda t: t[0])
        n = len(B)
        for j, grp in enumerate([B[:n // 4], B[n // 4:n // 2], B[n // 2:3 * n // 4], B[3 * n // 4:]]):
            if not grp:
                continue
            med = lambda f: statistics.median(f(t) for t in grp)
            # the split-once prologue's steps after the wait (RT_NW, RT_XDONE, RT_SYNCED; "-": none)
            after = lambda f: ("%5.2f" % med(lambda t: (t[f] - t[1]) / 1e3)) if len(grp[0]) > f and grp[0][f] else "    -"
            # the producer's ring requested once through and landed (RT_ISSUED, RT_LANDED), us after entry
            since_entry = lambda f: (("%5.2f" % med(lambda t: (t[f] - t[0]) / 1e3)) if len(grp[0]) > f and
                                     all(t[f] for t in grp) else "    -")
            print("       entry group %d: entry %7.1f wait %7.1f first %7.1f (wait->first %5.2f: nw %s x %s sync %s) "
                  "tile0 %5.2f tile1 %5.2f end %7.1f tiles %.1f ring issued %s landed %s" % (
                      j, med(lambda t: us(t[0])), med(lambda t: us(t[1])), med(lambda t: us(t[2])),
                      med(lambda t: (t[2] - t[1]) / 1e3), after(16), after(17), after(18), med(lambda t: (t[6] - t[2]) / 1e3),
                      med(lambda t: (t[7] - t[6]) / 1e3 if t[5] > 1 else 0), med(lambda t: us(t[3])),
                      med(lambda t: t[5]), since_entry(19), since_entry(20)))
            # thread 0's first stages: when it had each (us after RT_FIRST's stage 0) and its time waiting for them
            if len(grp[0]) > 31 and all(t[22] and t[31] for t in grp):
                print("           stages seen (us after stage 0): %s; waited %5.2f us in all" % (
                    " ".join("%5.2f" % med(lambda t: (t[22 + i] - t[22]) / 1e3) for i in range(1, 10)),
                    med(lambda t: t[21] / 1e3)))
