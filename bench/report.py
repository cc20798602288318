#!/usr/bin/env python3
"""Turns the R/M lines of the bench programs into the results table (bench/run calls it).

R lines: R, bench, param, metric, variant, rep, value (one repetition of one variant).
M lines: M, key, value (machine and run facts).
S lines: S, variant, system call, calls per connection (strace -c).
P lines: P, op, variant, Ir per operation, function (callgrind, row 4's profile).
T lines: T, translation unit, g++ phase, CPU seconds, GGC MB (-ftime-report, row 5).
Ratios are paired: rpmapp's value in repetition i over the anchor's value in the same
repetition i (the variants ran back to back), then the median and the range of those.

Usage: report.py FILE.tsv... [--doc docs/performance.md --notes bench/performance-notes.md]
                 [--picture FILE.png]
With --doc the ratios are also drawn (matplotlib, when this python3 has it) into a PNG next
to the page (docs/performance.png), or into --picture.
"""
import argparse
import os
import re
import statistics
import sys
from collections import OrderedDict

BENCH_NAMES = {
    "listen": "1. listen + shutdown",
    "seq": "2. sequential setup",
    "conc": "3. concurrent setup",
    "instr": "4. instructions, fake provider",
    "compile": "5. compile cost",
    "data": "6. data path",
    "memory": "8. a server holding N connections: memory, fds, accept rate",
    "grant": "9. grants",
    "isolation": "10. a protection domain per connection, sequential setup",
    "seq@iwarp": "2. sequential setup, iWARP (siw)",
    "data@iwarp": "6. data path, iWARP (siw)",
    "grant@iwarp": "9. grants, iWARP (siw)",
}
ORDER = ["listen", "seq", "seq@iwarp", "conc", "instr", "compile", "data", "data@iwarp", "memory",
         "grant", "grant@iwarp", "isolation"]
HIGHER_BETTER = {"conn/s", "conn/s filling", "MB/s"}

# The targets rpmapp is held to, as limits on the median of a row's paired ratio (in the
# table's direction: at most LIMIT for ↓ metrics, at least LIMIT for ↑ ones):
# (bench, params or None for all, metrics or None for all, anchor: "librpma" or "second" =
# raw / hand-written, LIMIT). Row 7's servers are compared with "raw", the hand-written server.
TARGETS = [
    ("listen", None, None, "librpma", 1.0),
    ("listen", None, None, "second", 1.0),
    ("seq", None, None, "librpma", 1.15),
    ("conc", ("C=1", "C=16", "C=64"), None, "second", 0.95),
    ("instr", ("listen", "accept", "connect"), None, "second", 1.5),
    ("instr", ("read", "write", "send", "recv"), None, "second", 1.1),
    # second = deps_include.cpp, the floor in the same mode
    ("compile", ("include",), None, "second", 2.0),
    ("compile", ("tu",), None, "second", 3.0),
    ("compile", ("tu, compiled mode",), None, "second", 1.5),
    ("memory", None, ("KiB/conn RSS", "KiB/conn peak"), "second", 1.1),
    ("serve", None, None, "second", 0.95),
]


def target(bench, param, metric, anchor):
    bench = bench.split("@")[0]  # the same targets on every transport
    for t_bench, t_params, t_metrics, t_anchor, limit in TARGETS:
        if (t_bench == bench and t_anchor == anchor and (t_params is None or param in t_params)
                and (t_metrics is None or metric in t_metrics)):
            return limit
    return None


def read(files):
    groups, meta, syscalls = OrderedDict(), OrderedDict(), {}
    read.profile = OrderedDict()  # (op, variant) -> [(Ir per op, function)]
    read.phases = OrderedDict()  # phase -> {translation unit: (seconds, MB)}
    for name in files:
        with open(name) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if parts[0] == "M" and len(parts) == 3:
                    meta[parts[1]] = parts[2]
                elif parts[0] == "P" and len(parts) == 5:
                    read.profile.setdefault((parts[1], parts[2]), []).append((int(parts[3]), parts[4]))
                elif parts[0] == "T" and len(parts) == 5:
                    read.phases.setdefault(parts[2], {})[parts[1]] = (float(parts[3]), float(parts[4]))
                elif parts[0] == "S" and len(parts) == 4:
                    syscalls.setdefault(parts[2], {})[parts[1]] = float(parts[3])
                elif parts[0] == "R" and len(parts) == 7:
                    _, bench, param, metric, variant, rep, value = parts
                    g = groups.setdefault((bench, param, metric), {})
                    g.setdefault(variant, {})[int(rep)] = float(value)
    return groups, meta, syscalls


def syscall_table(syscalls, vs=("rpmapp", "rpmapp-defaults", "librpma", "raw"),
                  labels=("rpmapp", "rpmapp, ConnConfig's defaults", "librpma", "raw librdmacm")):
    """System calls per connection (client + server) per implementation, from strace -c."""
    if not any(v in c for c in syscalls.values() for v in vs):
        return ""
    total = {v: sum(c.get(v, 0) for c in syscalls.values()) for v in vs}
    names = [n for n, c in syscalls.items() if max(c.get(v, 0) for v in vs) >= 0.5]
    names.sort(key=lambda n: -max(syscalls[n].get(v, 0) for v in vs))
    lines = ["| system call | " + " | ".join(labels) + " |", "|---" * (len(vs) + 1) + "|"]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(f"{syscalls[n].get(v, 0):.1f}" for v in vs) + " |")
    lines.append("| **all** | " + " | ".join(f"**{total[v]:.0f}**" for v in vs) + " |")
    return "\n".join(lines)


def serve_names(syscalls, groups):
    """The servers of benchmark 7 in the order the program ran them (raw first)."""
    names = []
    for key, g in groups.items():
        if key[0] == "serve":
            names += [v for v in g if v not in names]
    for c in syscalls.values():
        names += [v[len("serve:"):] for v in c if v.startswith("serve:") and v[len("serve:"):] not in names]
    return names


def serve_table(groups):
    """Benchmark 7: one row per (C, server); ratios to the first server (raw, hand-written)
    and to the second (rpmapp in a hand-written epoll loop), paired by repetition."""
    keys = [k for k in groups if k[0] == "serve"]
    if not keys:
        return ""
    lines = ["| in flight | server | conn/s ↑ | ratio to raw (hand-written) | ratio to rpmapp-epoll |",
             "|---|---|---|---|---|"]
    for key in keys:
        g = groups[key]
        names = list(g)
        ref, loop_ref = names[0], names[1] if len(names) > 1 else None
        for v in names:
            med, spread = summary(g[v])
            cells = [key[1], v, fmt_value(med) + (f" ±{spread / 2:.0f}%" if len(g[v]) > 1 else "")]
            for anchor in (ref, loop_ref):
                if anchor is None or v == anchor or names.index(v) < names.index(anchor):
                    cells.append("—")
                    continue
                r = paired(g[v], g[anchor])
                if r is None:
                    cells.append("—")
                    continue
                med_r, lo, hi = r
                cells.append(f"{med_r:.2f} [{lo:.2f}–{hi:.2f}] {verdict(r, True)}".strip())
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


SERVE_LEGEND = """Benchmark 7 (`bench_connect serve`): the same client (raw librdmacm, as in row 3,
max(K, 2C) connections with C in flight) against each server of `bench/servers.hpp` in
turn, interleaved in one process with the order rotating each repetition: `raw` is the
hand-written async librdmacm server (one event channel for the listener and every
connection, no migration), `rpmapp-epoll` rpmapp's `Endpoint` and `Conn`s in a
hand-written epoll loop (row 3's rpmapp server), `callback` rpmapp's `EventLoop` with
`serve` and `watch` handlers on one thread, `coroutine` the same loop with a `Task` that
co_awaits `next_conn_req` and spawns a `Task` per connection that co_awaits `next_event`.
Ratios are paired by repetition, median
[min–max]; the target for the loop's servers is 0.95 of `raw`."""


def fmt_value(v):
    if v >= 1e6:
        return f"{v / 1e6:.2f} M"
    if v >= 1e4:
        return f"{v / 1e3:.1f} k"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def summary(values):
    """median and relative spread ((max - min) / median) of one variant's repetitions."""
    vals = list(values.values())
    med = statistics.median(vals)
    spread = (max(vals) - min(vals)) / med * 100 if med and len(vals) > 1 else 0.0
    return med, spread


def paired(a, b):
    reps = sorted(set(a) & set(b))
    ratios = [a[r] / b[r] for r in reps if b[r]]
    if not ratios:
        return None
    return statistics.median(ratios), min(ratios), max(ratios)


def verdict(ratio, higher_better, words=("slower", "faster")):
    """'slower' / 'faster' (or other `words`: worse, better) when the median is more than 3%
    off, '(every rep)' when every pair agrees."""
    if ratio is None:
        return ""
    med, lo, hi = ratio
    worse = med < 0.97 if higher_better else med > 1.03
    better = med > 1.03 if higher_better else med < 0.97
    if not worse and not better:
        return "same"
    several = lo != hi  # a deterministic count has one value: nothing to agree
    if worse:
        clear = several and (hi < 1 if higher_better else lo > 1)
        return words[0] + (" (every rep)" if clear else "")
    clear = several and (lo > 1 if higher_better else hi < 1)
    return words[1] + (" (every rep)" if clear else "")


# rpmapp in another mode, shown as rows of its own against the same anchors:
# variant -> (what the row's parameter adds, the hand-written code in that mode: the row's
# "hand" when measured, else the default mode's)
MODE_ROWS = {"rpmapp-shared": ("EventLoop, SharedEventChannel + SharedCq + Srq", "hand-shared")}
MODE_ANCHORS = {anchor for _, anchor in MODE_ROWS.values()}


def with_mode_rows(groups):
    """Adds, for each group holding a MODE_ROWS variant, a group where that variant is
    "rpmapp" (the anchors kept), so that rows() shows it beside rpmapp's default."""
    out = OrderedDict()
    for key, g in groups.items():
        out[key] = g
        for variant, (label, anchor) in MODE_ROWS.items():
            if variant in g:
                bench, param, metric = key
                mode = OrderedDict([("rpmapp", g[variant])])
                for v, vals in g.items():
                    if v not in MODE_ROWS and v not in MODE_ANCHORS and v != "rpmapp":
                        mode[v] = g[anchor] if v == "hand" and anchor in g else vals
                out[(bench, f"{param}, {label}", metric)] = mode
    return out


def rows(groups):
    out = []
    groups = with_mode_rows(groups)
    keys = sorted(groups, key=lambda k: (ORDER.index(k[0]) if k[0] in ORDER else 99))
    for key in keys:
        bench, param, metric = key
        g = groups[key]
        if "rpmapp" not in g or bench == "listen-calls":  # the breakdown has its own table
            continue
        if bench == "compile" and set(g) <= {"rpmapp", "rpmapp-gc"}:  # mode_table's alone
            continue
        higher_better = metric in HIGHER_BETTER
        words = ("larger", "smaller") if bench == "memory" and not higher_better else ("slower", "faster")
        second = next((v for v in ("hand", "deps", "shared") if v in g), "raw")
        cells = {}
        for v in ("rpmapp", "librpma", second):
            if v in g:
                med, spread = summary(g[v])
                n = len(g[v])
                cells[v] = fmt_value(med) + (f" ±{spread / 2:.0f}%" if n > 1 else "")
            else:
                cells[v] = "—"
        r1 = paired(g["rpmapp"], g["librpma"]) if "librpma" in g else None
        r2 = paired(g["rpmapp"], g[second]) if second in g else None

        def show(r):
            if r is None:
                return "—"
            med, lo, hi = r
            return f"{med:.2f}" if lo == hi else f"{med:.2f} [{lo:.2f}–{hi:.2f}]"

        what = BENCH_NAMES.get(bench, bench) + ("" if param == "-" else f", {param}")
        second_label = {"hand": "hand-written", "deps": "rpmapp's dependencies alone",
                        "shared": "rpmapp on its Peer's domain"}.get(second, "raw")
        out.append({
            "bench": bench, "param": param, "metric_name": metric, "higher_better": higher_better,
            "ratios": (r1, r2),
            "what": what, "metric": metric + (" ↑" if higher_better else " ↓"),
            "rpmapp": cells["rpmapp"], "librpma": cells["librpma"],
            "raw": cells[second] + {"hand": " (hand)", "deps": " (deps)", "shared": " (shared domain)"}.get(second, ""),
            "r_librpma": show(r1), "r_raw": show(r2),
            "v_librpma": verdict(r1, higher_better, words), "v_raw": verdict(r2, higher_better, words),
            "second": second_label,
        })
    return out


HEADER = ["benchmark", "metric", "rpmapp", "librpma", "raw librdmacm", "rpmapp/librpma",
          "rpmapp/raw"]


def markdown(table):
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in table:
        lines.append("| " + " | ".join([
            r["what"], r["metric"], r["rpmapp"], r["librpma"], r["raw"],
            f'{r["r_librpma"]} {r["v_librpma"]}'.strip(), f'{r["r_raw"]} {r["v_raw"]}'.strip(),
        ]) + " |")
    return "\n".join(lines)


def slower_list(table):
    items = []
    for r in table:
        for anchor, v, ratio in (("librpma", r["v_librpma"], r["r_librpma"]),
                                 (r["second"], r["v_raw"], r["r_raw"])):
            worse = v.split(" ")[0]
            if worse in ("slower", "larger"):
                items.append(f"- {r['what']} ({r['metric'][:-2]}): {worse} than {anchor}, "
                             f"ratio {ratio}{' in every repetition' if 'every' in v else ''}")
    return items


LEGEND = """Values: median of the repetitions, ± half their range in % of the median. Ratios:
rpmapp's value over the anchor's in the same repetition (the variants ran back to back,
rotating which went first), median [min–max] of those paired ratios. ↑ = higher is better
(connections/s, MB/s: a ratio above 1 means rpmapp is faster), ↓ = lower is better (ns, µs,
Ir, seconds, MB, KiB: a ratio below 1 means rpmapp is cheaper). "slower"/"faster" (for
memory "larger"/"smaller") marks a median more than 3% off 1; "(every rep)" when every
paired ratio agrees. Rows 4, 6 and 8 compare rpmapp with hand-written code (marked "(hand)"
in the "raw librdmacm" column): in row 4 a sequence making the same provider calls through
the same fake, in row 6 verbs (ibv_post_send / ibv_post_recv / ibv_poll_cq) on a connection
made with librdmacm, in row 8 a librdmacm server with the same queue sizes; row 5 has,
marked "(deps)" in that column, the floor: a TU including only the headers rpmapp's headers
include (standard, POSIX, rdma-core, fmt, tl-expected), so rpmapp/raw there is rpmapp's own
cost over its dependencies'."""


PICTURE_LEGEND = """The picture shows every ratio of the tables below turned so that right of 1 is
always rpmapp ahead (a cost's ratio is inverted): green ahead, red behind, grey within 3%,
hatched against librpma, plain against hand-written or raw librdmacm; the whiskers are the
range of the paired ratios and a black tick marks the target where there is one."""


SYSCALL_LEGEND = """Client and server together, per sequential connection (connect, established,
disconnect, closed, release), in the same VM: `strace -f -c` of `bench_connect one VARIANT K`
for K = 5 and K = 25, the difference divided by 20 (so the setup drops out). Counts are
deterministic except for the waits (`epoll_wait`, `poll`, `futex`, `sched_yield`), which
depend on timing. `write` on /dev/infiniband/rdma_cm is one rdma_cm command; `ioctl` on the
uverbs device is one verbs command (CQ, QP, completion channel, memory registration);
`openat` + `newfstatat` + `close` open and close an rdma_cm event channel; a completion
channel is an `ioctl` and a `close`. Rows below 0.5 calls per connection are left out."""


def picture_items(table, groups):
    """One bar per (row, anchor) with a ratio: the results table's rows against librpma and
    raw / hand-written, then row 7's servers against the hand-written one."""
    items = []
    for r in table:
        for anchor, label, ratio in (("librpma", "librpma", r["ratios"][0]),
                                     ("second", r["second"], r["ratios"][1])):
            # a zero (rpmapp's 0 fds per connection on a shared event channel) has no place on a log scale
            if ratio is not None and min(ratio) > 0:
                items.append({"row": f"{r['what']} ({r['metric']})", "anchor": label, "ratio": ratio,
                              "higher_better": r["higher_better"],
                              "target": target(r["bench"], r["param"], r["metric_name"], anchor)})
    for key in (k for k in groups if k[0] == "serve"):
        g = groups[key]
        names = list(g)
        for v in names[1:]:
            ratio = paired(g[v], g[names[0]])
            if ratio is not None:
                items.append({"row": f"7. server {v}, {key[1]} ({key[2]} ↑)", "anchor": names[0], "ratio": ratio,
                              "higher_better": True, "target": target("serve", key[1], key[2], "second")})
    return items


def draw(items, path, title):
    """Horizontal bars on a log scale centred on 1, oriented so that right is always better
    for rpmapp: a rate's ratio as it is, a cost's ratio inverted (anchor / rpmapp). Green =
    ahead by more than 3%, red = behind, grey = within 3%; whiskers = the range of the paired
    ratios; a black tick = the target. Ratios beyond 10x are drawn to the edge (their number
    says how far), so that the ones near 1 stay readable. Returns False when matplotlib is
    missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
        from matplotlib.ticker import FixedLocator, NullLocator
    except ImportError:
        return False
    rows_ = list(OrderedDict((it["row"], None) for it in items))
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.42 * len(rows_)))
    clip = 10.0
    extreme = 1.3
    for it in items:
        med, lo, hi = it["ratio"]
        extreme = max(extreme, hi, 1 / lo, 1 / hi, lo, *(() if it["target"] is None else (it["target"], 1 / it["target"])))
    span = min(extreme, clip) * 1.6  # room for the numbers
    edge = lambda v: min(max(v, 1 / clip), clip)  # noqa: E731
    for it in items:
        med, lo, hi = it["ratio"]
        if not it["higher_better"]:  # a cost: anchor / rpmapp, so that > 1 is rpmapp ahead
            med, lo, hi = 1 / med, 1 / hi, 1 / lo
        lim = it["target"]
        if lim is not None and not it["higher_better"]:
            lim = 1 / lim
        second = it["anchor"] != "librpma"
        y = rows_.index(it["row"]) + (0.2 if second else -0.2)
        color = "#2e9e4f" if med > 1.03 else "#d1495b" if med < 1 / 1.03 else "#9e9e9e"
        off_scale = med != edge(med)
        med, lo, hi = edge(med), edge(lo), edge(hi)
        ax.barh(y, med - 1, left=1, height=0.38, color=color, edgecolor="black", linewidth=0.4,
                hatch=None if second else "///")
        if hi > lo:
            ax.errorbar(med, y, xerr=[[med - lo], [hi - med]], fmt="none", ecolor="black", elinewidth=0.8,
                        capsize=2)
        if lim is not None:
            ax.vlines(lim, y - 0.24, y + 0.24, color="black", linewidth=2.2)
        text = f"{it['ratio'][0]:.2f}"  # the table's ratio, as printed there
        ahead = med >= 1
        if off_scale:  # inside the bar's end, which is the axis' edge
            ax.annotate(text + " (off scale)", (med, y), xytext=(-4 if ahead else 4, 0), textcoords="offset points",
                        ha="right" if ahead else "left", va="center", fontsize=7, color="white", weight="bold")
        else:
            ax.annotate(text, (max(med, hi) if ahead else min(med, lo), y), xytext=(4 if ahead else -4, 0),
                        textcoords="offset points", ha="left" if ahead else "right", va="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_xlim(1 / span, span)
    ticks = (0.1, 0.2, 0.5, 1, 2, 5, 10) if span > 4 else (0.25, 0.5, 0.8, 1, 1.25, 2, 4)
    ticks = [t for t in ticks if 1 / span <= t <= span]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{t:g}×" for t in ticks])
    ax.axvspan(1 / span, 1, color="#d1495b", alpha=0.06)
    ax.axvspan(1, span, color="#2e9e4f", alpha=0.06)
    ax.axvline(1, color="black", linewidth=1)
    ax.set_yticks(range(len(rows_)))
    ax.set_yticklabels(rows_, fontsize=8)
    ax.set_ylim(len(rows_) - 0.4, -0.6)
    ax.grid(axis="x", color="#cccccc", linewidth=0.5)
    ax.set_axisbelow(True)
    ax.text(1 / span * 1.05, -0.55, "← rpmapp behind", ha="left", va="top", fontsize=9, color="#a0303f")
    ax.text(span / 1.05, -0.55, "rpmapp ahead →", ha="right", va="top", fontsize=9, color="#1f6e37")
    ax.set_xlabel("how many times better rpmapp does (log scale): rpmapp / anchor for rates (↑), "
                  "anchor / rpmapp for costs (↓);\nbar = median of the paired ratios, whiskers = their "
                  "range, number = the ratio as in the table", fontsize=8)
    handles = [Patch(facecolor="#2e9e4f", edgecolor="black", linewidth=0.4, label="ahead by more than 3%"),
               Patch(facecolor="#d1495b", edgecolor="black", linewidth=0.4, label="behind by more than 3%"),
               Patch(facecolor="#9e9e9e", edgecolor="black", linewidth=0.4, label="within 3%"),
               Patch(facecolor="white", edgecolor="black", linewidth=0.4, hatch="///", label="against librpma (upper bar)"),
               Patch(facecolor="white", edgecolor="black", linewidth=0.4,
                     label="against hand-written / raw librdmacm (lower bar)"),
               Line2D([], [], color="black", linewidth=2.2, label="target")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.9 / (1.2 + 0.42 * len(rows_)) - 0.02),
              ncol=3, fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return True


def listen_calls_table(groups):
    """Benchmark 1's per-call breakdown (`bench_listen calls`): median ns per cycle of each
    librdmacm call (and poll) in rpmapp, librpma and raw, calls per cycle, and the rest."""
    vs = ("rpmapp", "librpma", "raw")
    calls = [k[1] for k in groups if k[0] == "listen-calls" and k[2] == "ns/cycle"]
    if not calls:
        return ""
    # the calls in the order the programs print them, the two sums last
    calls = [c for c in calls if not c.startswith("(")] + [c for c in calls if c.startswith("(")]
    lines = ["| call | rpmapp ns | librpma ns | raw ns | calls per cycle (rpmapp / librpma / raw) |",
             "|---|---|---|---|---|"]
    for call in calls:
        g = groups[("listen-calls", call, "ns/cycle")]
        n = groups.get(("listen-calls", call, "calls/cycle"), {})
        cells = [fmt_value(statistics.median(g[v].values())) if v in g else "—" for v in vs]
        counts = " / ".join(f"{statistics.median(n[v].values()):g}" if v in n else "0" for v in vs)
        label = {"(rest)": "everything else (user space, uninstrumented calls)",
                 "(cycle)": "**the whole cycle**"}.get(call, f"`{call}`")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {counts if n else ''} |")
    return "\n".join(lines)


# Row 4's profile: where each operation's instructions go, by kind of work.
PROFILE_KINDS = (
    ("fake provider", "the fake's own code (the same calls in both: `bench_instr check`)"),
    ("allocation", "malloc, free, new, delete"),
    ("shared_ptr", "reference counts (std::shared_ptr's control block)"),
    ("locks", "pthread mutexes"),
    ("clock", "std::chrono::steady_clock::now"),
    ("libc", "other libc calls (errno, memcpy, memchr, strlen, inet_pton)"),
    ("own code", "the library's or the hand-written code itself, with the std code and the "
                 "benchmark loop inlined into it"),
)


def profile_kind(function):
    if function.startswith("bench::fake::"):
        return "fake provider"
    if re.search(r"\b(malloc|free|_int_free|_int_malloc|operator new|operator delete|cfree)\b", function):
        return "allocation"
    if "_Sp_counted" in function:
        return "shared_ptr"
    if "pthread_mutex" in function:
        return "locks"
    if "steady_clock" in function or "clock_gettime" in function:
        return "clock"
    if "::" not in function and "(" not in function:
        return "libc"
    return "own code"


def short_function(function):
    """callgrind's demangled name without namespaces, template arguments and parameters."""
    f = re.sub(r"rpmapp::v\d+_\d+_(tl|std)(_lib)?::", "", function)
    f = f.replace("(anonymous namespace)::", "")
    f = re.sub(r"^decltype \(\{parm#2\}\(\)\) ", "", f)
    inner = re.match(r"detail::no_throw<(.*?)\(", f)
    if inner:
        return f"no_throw wrapper of {inner.group(1)}"
    f = re.sub(r"::\{lambda\([^)]*\)#\d+\}::operator\(\)\(\) const", ": its lambda", f)
    out, depth = [], 0
    for c in f:
        if c in "(<":
            depth += 1
        elif c in ")>":
            depth -= 1
        elif depth == 0:
            out.append(c)
    f = "".join(out).replace(" [clone .isra.0]", "").replace(" const", "").strip()
    return f


def profile_tables(profile, ops=("listen", "accept", "connect"), top=12):
    """Row 4's instructions by kind of work (rpmapp / hand-written), and rpmapp's
    costliest functions by their own instructions, per operation."""
    if not any((op, "rpmapp") in profile for op in ops):
        return ""
    kinds = [k for k, _ in PROFILE_KINDS]
    lines = ["| kind of work | " + " | ".join(f"{op} (rpmapp / hand)" for op in ops) + " |",
             "|---" * (len(ops) + 1) + "|"]
    sums = {}
    for op in ops:
        for v in ("rpmapp", "hand"):
            total = {k: 0 for k in kinds}
            for ir, fn in profile.get((op, v), []):
                total[profile_kind(fn)] += ir
            sums[(op, v)] = total
    for k, what in PROFILE_KINDS:
        lines.append(f"| {k}: {what} | " + " | ".join(
            f"{sums[(op, 'rpmapp')][k]:,} / {sums[(op, 'hand')][k]:,}" for op in ops) + " |")
    lines.append("| **all** | " + " | ".join(
        f"**{sum(sums[(op, 'rpmapp')].values()):,} / {sum(sums[(op, 'hand')].values()):,}**"
        for op in ops) + " |")
    out = "\n".join(lines)
    for op in ops:
        rows = [(ir, fn) for ir, fn in profile.get((op, "rpmapp"), [])
                if profile_kind(fn) == "own code"]
        rows.sort(key=lambda r: -r[0])
        merged = OrderedDict()
        for ir, fn in rows:
            name = short_function(fn)
            merged[name] = merged.get(name, 0) + ir
        listed = sorted(merged.items(), key=lambda kv: -kv[1])[:top]
        out += (f"\n\n{op}: rpmapp's own code, the {len(listed)} functions with the most instructions "
                "of their own (inlined callees included), Ir per operation\n\n"
                "| function | Ir/op |\n|---|---|\n"
                + "\n".join(f"| `{name}` | {ir:,} |" for name, ir in listed))
    return out


PROFILE_LEGEND = """Where row 4's instructions go: `callgrind_annotate --inclusive=no` of each
operation (rpmapp's and the hand-written sequence's), every function's own instructions per
operation, summed by kind of work. The fake provider's share is the same in both (the same
calls); what rpmapp adds is in the other rows. The function lists name rpmapp's code as
callgrind sees it after inlining: a function's count includes what the compiler inlined
into it. `RpmappSide::*_cycle` is the benchmark's loop with rpmapp's inline API calls
(`Conn::next_event`, `disconnect`, ...) inlined into it."""


def phase_table(phases, tus=("rpmapp_include", "rpmapp_tu", "rpmapp_tu:compiled", "deps_include")):
    """Row 5 by g++ phase: each phase's share of a translation unit's user CPU time, and
    its garbage-collected memory."""
    if "TOTAL" not in phases:
        return ""
    names = {"parsing": "parsing (declarations, class templates, inline function bodies)",
             "lang. deferred": "lang. deferred (function templates and inline functions used)",
             "opt and generate": "opt and generate (optimisation and code of what is emitted)"}
    order = [p for p in names if p in phases]
    order += [p for p in phases if p not in names and p not in ("setup", "TOTAL")]
    total = phases["TOTAL"]
    def label(tu):  # "name:compiled" is name.cpp compiled with -DRPMAPP_SEPARATE_COMPILATION
        name, _, mode = tu.partition(":")
        return f"{name}.cpp" + (", compiled mode" if mode else "")
    lines = ["| g++ phase | " + " | ".join(f"{label(tu)}: share of time, MB" for tu in tus) + " |",
             "|---" * (len(tus) + 1) + "|"]

    def cell(phase, tu):
        if tu not in phases[phase] or tu not in total or total[tu][0] <= 0:
            return "—"
        secs, mb = phases[phase][tu]
        return f"{100 * secs / total[tu][0]:.0f}%, {mb:.0f}"
    for phase in order:
        if all(phases[phase].get(tu, (0, 0)) == (0, 0) for tu in tus):
            continue
        lines.append(f"| {names.get(phase, phase)} | " + " | ".join(cell(phase, tu) for tu in tus) + " |")
    lines.append("| **all** (user CPU seconds under -ftime-report, MB) | " + " | ".join(
        f"**{total[tu][0]:.2f} s, {total[tu][1]:.0f}**" if tu in total else "—" for tu in tus) + " |")
    return "\n".join(lines)


PHASE_LEGEND = """Row 5 by g++ phase (`-ftime-report`, one compilation of each translation unit after
the timed ones, same flags): each phase's share of the unit's user CPU time, and g++'s
garbage-collected memory allocated in it. `-ftime-report` slows the compiler down (it reads
the clock around every step), so its seconds are only good for shares; the timed row 5 is
the cost. `deps_include.cpp` is the floor: the headers rpmapp's headers include, nothing
else."""


def mode_table(groups):
    """Row 5's compiled mode against header-only: rpmapp's compile time and memory, build
    and link times and binary sizes in compiled mode over the same source's header-only,
    paired by repetition; a static link with -Wl,--gc-sections in its own column."""
    lines = ["| what | metric | header-only | compiled mode | compiled / header-only "
             "| compiled mode, `-Wl,--gc-sections` |", "|---|---|---|---|---|---|"]

    def cell(g):
        v, spread = summary(g)
        return fmt_value(v) + (f" ±{spread / 2:.0f}%" if len(g) > 1 else "")
    for (bench, param, metric), g in groups.items():
        compiled = groups.get((bench, f"{param}, compiled mode", metric), {})
        if bench != "compile" or param.endswith("compiled mode") or "rpmapp" not in compiled:
            continue
        med, lo, hi = paired(compiled["rpmapp"], g["rpmapp"])
        ratio = f"{med:.2f}" if lo == hi else f"{med:.2f} [{lo:.2f}–{hi:.2f}]"
        gc = cell(compiled["rpmapp-gc"]) if "rpmapp-gc" in compiled else "—"
        lines.append(f"| {param} | {metric} ↓ | {cell(g['rpmapp'])} | {cell(compiled['rpmapp'])} "
                     f"| {ratio} | {gc} |")
    return "\n".join(lines) if len(lines) > 2 else ""


MODE_LEGEND = """Row 5 in both modes: the same sources compiled header-only and with
`-DRPMAPP_SEPARATE_COMPILATION` (docs/packaging.md, "Header-only or compiled"), each mode's
rows against its own floor (`deps_include.cpp` compiled in that mode) in the table above,
and here against each other, paired by repetition. "example 01 server" is
`examples/01-connection/server.cpp`: its compile (librpmapp not counted), its link (against
librpmapp.a in compiled mode) and its binary (`size` text, and stripped). "20-TU program"
is twenty copies of `rpmapp_tu.cpp` under their own names plus a `main`, built from scratch
with one compiler per core: wall time of the whole build, librpmapp.a's five sources
included in compiled mode."""


def pool_table(groups):
    """`bench_connect pool`: sequential raw connections with their own CQ and QP against the
    same with a CQ and a QP kept across connections."""
    rows = [(k, g) for k, g in groups.items() if k[0] == "pool" and "raw" in g and "raw-pooled" in g]
    if not rows:
        return ""
    lines = ["| connections | raw conn/s ↑ | raw with pooled queues conn/s ↑ | pooled / raw |",
             "|---|---|---|---|"]
    for (bench, param, metric), g in rows:
        (a, sa), (b, sb) = summary(g["raw"]), summary(g["raw-pooled"])
        med, lo, hi = paired(g["raw-pooled"], g["raw"])
        lines.append(f"| sequential, {param} | {fmt_value(a)} ±{sa / 2:.0f}% | {fmt_value(b)} ±{sb / 2:.0f}% "
                     f"| {med:.2f} [{lo:.2f}–{hi:.2f}] |")
    return "\n".join(lines)


POOL_LEGEND = """What a pool of queues gives, measured on raw librdmacm (`bench_connect pool`, the
stretch goal's first step): row 2's raw client and server against the same two with a CQ
and a QP kept across connections (made once with `ibv_create_qp`, driven through INIT,
RTR and RTS with `rdma_init_qp_attr` for each connection, `rdma_establish` on the client,
back to RESET after), interleaved in one process, ratios paired by repetition. Every
pooled connection carries an 8-byte send, which the server counts: the run fails unless all
arrived"""


LISTEN_CALLS_LEGEND = """Benchmark 1 call by call (`bench_listen calls`): the same listen + shutdown
cycles as row 1, with every librdmacm call the cycle makes (and `poll`) timed by wrappers that
the benchmark puts in front of librdmacm's own, so librpma's calls are timed as rpmapp's and
raw's are. Medians over the repetitions, nanoseconds per cycle; "everything else" is the
cycle's time outside those calls (its user-space work, and calls not wrapped, such as
`fcntl`)."""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--doc")
    ap.add_argument("--notes")
    ap.add_argument("--picture")
    args = ap.parse_args()
    groups, meta, syscalls = read(args.files)
    table = rows(groups)
    md = markdown(table)
    print(md)
    sys_md = syscall_table(syscalls)
    if sys_md:
        print("\nsystem calls per connection (client + server, sequential, strace -c):\n" + sys_md)
    pool_md = pool_table(groups)
    if pool_md:
        print("\nraw librdmacm with a pool of queues (sequential):\n" + pool_md)
    conc_sys_md = syscall_table(syscalls, ("conc64:rpmapp", "conc64:raw"), ("rpmapp", "raw librdmacm"))
    if conc_sys_md:
        print("\nsystem calls per connection (client + server, 64 in flight, strace -c):\n" + conc_sys_md)
    profile_md = profile_tables(read.profile)
    if profile_md:
        print("\n4. instructions by kind of work, per operation (rpmapp / hand-written):\n" + profile_md)
    mode_md = mode_table(groups)
    if mode_md:
        print("\n5. compile cost, compiled mode against header-only:\n" + mode_md)
    phase_md = phase_table(read.phases)
    if phase_md:
        print("\n5. compile cost by g++ phase:\n" + phase_md)
    calls_md = listen_calls_table(groups)
    if calls_md:
        print("\n1. listen + shutdown, call by call (ns per cycle):\n" + calls_md)
    servers = serve_names(syscalls, groups)
    serve_md = serve_table(groups)
    if serve_md:
        print("\n7. servers, one client (conc's raw client):\n" + serve_md)
    serve_sys_md = syscall_table(syscalls, tuple("serve:" + n for n in servers), tuple(servers))
    if serve_sys_md:
        print("\nsystem calls per connection, servers (raw client + server, sequential):\n" + serve_sys_md)
    slow = slower_list(table)
    print("\nwhere rpmapp is behind:" if slow else "\nrpmapp is nowhere behind by more than 3%.")
    for s in slow:
        print(s)
    picture = args.picture or (os.path.splitext(args.doc)[0] + ".png" if args.doc else None)
    drawn = False
    if picture:
        title = (f"rpmapp against librpma and hand-written code, {meta.get('date', '?')}, "
                 f"commit {meta.get('commit', '?')}")
        drawn = draw(picture_items(table, groups), picture, title)
        print(f"\ndrew {picture}" if drawn else
              f"\nthe picture was not drawn: {sys.executable} has no matplotlib (python3-matplotlib)",
              file=sys.stderr)
    if not args.doc:
        return 0
    notes = open(args.notes).read() if args.notes else ""
    machine = [
        f"- Date: {meta.get('date', '?')}, commit {meta.get('commit', '?')}",
        f"- Host: {meta.get('cpu', '?')}, {meta.get('host_cpus', '?')} cores shared with other "
        f"jobs, kernel {meta.get('host_kernel', '?')}, {meta.get('compiler', '?')}",
        f"- RDMA (rows 1-3 and 6-8): {meta.get('rdma_device', '?')}, guest kernel "
        f"{meta.get('guest_kernel', '?')}, {meta.get('guest_cpus', '?')} vCPUs. The VM runs "
        "under TCG (software emulation, no KVM on this host): CPU-bound work runs about 5x "
        "slower than on the host, so absolute numbers say little about real hardware; the "
        "ratios are what to read." + (
            f" Rows marked iWARP (2, 6 and 9) ran again on {meta['iwarp_device']}: siw makes "
            "its connections over the kernel's TCP and has no memory windows, so row 9 there "
            "has only grants by registration." if "iwarp_device" in meta else ""),
        "- Rows 4-5 ran on the host." + (
            f" The VM's rows are from its run of {meta['vm_reused']} (`bench/run --host-only` "
            "reran rows 4-5 alone)." if "vm_reused" in meta else ""),
        f"- Parameters: {meta.get('params', '?')}",
        f"- Whole run (build included): {meta.get('elapsed', '?')} s; host load average "
        f"{meta.get('host_load', '?')}",
    ]
    with open(args.doc, "w") as f:
        f.write("# Performance\n\n")
        f.write("Generated by `bench/run` (see [benchmarks.md](benchmarks.md)); do not edit by "
                "hand, rerun it. The explanations after the table are kept in "
                "`bench/performance-notes.md`.\n\n")
        f.write("## Machine\n\n" + "\n".join(machine) + "\n\n")
        f.write("## Results\n\n")
        if drawn:
            f.write(f"![rpmapp's ratios against librpma and hand-written code]({os.path.basename(picture)})\n\n"
                    + PICTURE_LEGEND + "\n\n")
        else:
            f.write("(The picture of these ratios was not drawn: the python3 that wrote this page has no "
                    "matplotlib; Debian's python3-matplotlib provides it.)\n\n")
        f.write(md + "\n\n" + LEGEND + "\n\n")
        if profile_md:
            f.write("## Instructions: where they go\n\n" + PROFILE_LEGEND + "\n\n" + profile_md + "\n\n")
        if mode_md:
            f.write("## Compile cost: compiled mode against header-only\n\n" + MODE_LEGEND + "\n\n"
                    + mode_md + "\n\n")
        if phase_md:
            f.write("## Compile cost: where it goes\n\n" + PHASE_LEGEND + "\n\n" + phase_md + "\n\n")
        if calls_md:
            f.write("## Listen + shutdown, call by call\n\n" + LISTEN_CALLS_LEGEND + "\n\n" + calls_md + "\n\n")
        if sys_md:
            f.write("## System calls per connection\n\n" + SYSCALL_LEGEND + "\n\n" + sys_md + "\n\n")
        if pool_md:
            f.write(POOL_LEGEND + (f" ({meta['pool_checked']})" if "pool_checked" in meta else "")
                    + ".\n\n" + pool_md + "\n\n")
        if "queues_us" in meta and "queues_conn_us" in meta:
            q, c = float(meta["queues_us"]), float(meta["queues_conn_us"])
            cq = float(meta.get("queues_cq_us", "nan"))
            f.write("What a pool of queues could save (issue 12's stretch goal: measure first), from "
                    "`bench_connect queues` in the same VM: creating and destroying a CQ and a QP "
                    f"(row 2's sizes, raw verbs) takes {q:.0f} µs (the CQ alone {cq:.0f} µs), a "
                    f"sequential raw connection {c:.0f} µs (medians); both sides create and destroy "
                    f"theirs, {100 * 2 * q / c:.0f}% of a connection's time if the two sides did not "
                    "overlap.\n\n")
        if "timewait_ms" in meta:
            tw = float(meta["timewait_ms"])
            seq = [g for k, g in groups.items() if k[0] == "seq" and "rpmapp" in g]
            rate = summary(seq[0]["rpmapp"])[0] if seq else float("nan")
            f.write("How long a QP must wait before a pool may reuse it (`bench_connect timewait`, "
                    "same VM): rdma_cm reports `TIMEWAIT_EXIT`, the point from which rdma_get_cm_event(3) "
                    f"lets a QP be used again, {tw:.0f} ms after `DISCONNECTED` (median; "
                    f"{meta.get('timewait_range_ms', '')}). The pooled run above reuses each QP a few "
                    "ms after its connection closed, inside the CM's time-wait, which exists so that "
                    "packets of the old connection still in flight cannot reach the new one on the "
                    "same QP number. A pool that waits the time-wait out holds every released QP "
                    f"for {tw / 1000:.1f} s: at row 2's rate ({rate:.0f} conn/s) that is about "
                    f"{rate * tw / 1000:.0f} QPs held before the first reuse, each with its CQ and "
                    "queues; a run of row 2's length would reuse none.\n\n")
        if conc_sys_md:
            f.write("The same with 64 connections in flight, as row 3's C=64 (`bench_connect one VARIANT "
                    "K 64`, rpmapp in row 3's configuration; 128 and 384 connections):\n\n"
                    + conc_sys_md + "\n\n")
        if serve_md:
            f.write("## Servers: the event loop against hand-written ones\n\n" + SERVE_LEGEND + "\n\n"
                    + serve_md + "\n\n")
        if serve_sys_md:
            f.write("System calls per connection, client + server, as above but with the raw client "
                    "for every server (`bench_connect serve-one SERVER K`); the client's calls are "
                    "the same in every column, so the differences are the servers'.\n\n"
                    + serve_sys_md + "\n\n")
        f.write("## Where rpmapp is behind in this run\n\n")
        f.write("\n".join(slow) + "\n\n" if slow else "Nowhere by more than 3%.\n\n")
        f.write(notes)
    print(f"\nwrote {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
