#!/usr/bin/env python3
"""Turns the R/M lines of the bench programs into the results table (bench/run calls it).

R lines: R, bench, param, metric, variant, rep, value (one repetition of one variant).
M lines: M, key, value (machine and run facts).
Ratios are paired: rpmapp's value in repetition i over the anchor's value in the same
repetition i (the variants ran back to back), then the median and the range of those.

Usage: report.py FILE.tsv... [--doc docs/performance.md --notes bench/performance-notes.md]
"""
import argparse
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
}
ORDER = ["listen", "seq", "conc", "instr", "compile", "data"]
HIGHER_BETTER = {"conn/s", "MB/s"}


def read(files):
    groups, meta, syscalls = OrderedDict(), OrderedDict(), {}
    for name in files:
        with open(name) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if parts[0] == "M" and len(parts) == 3:
                    meta[parts[1]] = parts[2]
                elif parts[0] == "S" and len(parts) == 4:
                    syscalls.setdefault(parts[2], {})[parts[1]] = float(parts[3])
                elif parts[0] == "R" and len(parts) == 7:
                    _, bench, param, metric, variant, rep, value = parts
                    g = groups.setdefault((bench, param, metric), {})
                    g.setdefault(variant, {})[int(rep)] = float(value)
    return groups, meta, syscalls


def syscall_table(syscalls, vs=("rpmapp", "librpma", "raw"), labels=("rpmapp", "librpma", "raw librdmacm")):
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


def verdict(ratio, higher_better):
    """'slower' / 'faster' when the median is more than 3% off, 'clearly' when every pair agrees."""
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
        return "slower" + (" (every rep)" if clear else "")
    clear = several and (lo > 1 if higher_better else hi < 1)
    return "faster" + (" (every rep)" if clear else "")


def rows(groups):
    out = []
    keys = sorted(groups, key=lambda k: (ORDER.index(k[0]) if k[0] in ORDER else 99))
    for key in keys:
        bench, param, metric = key
        g = groups[key]
        if "rpmapp" not in g:
            continue
        higher_better = metric in HIGHER_BETTER
        second = "hand" if "hand" in g else "raw"
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
        second_label = "hand-written" if second == "hand" else "raw"
        out.append({
            "what": what, "metric": metric + (" ↑" if higher_better else " ↓"),
            "rpmapp": cells["rpmapp"], "librpma": cells["librpma"],
            "raw": cells[second] + (" (hand)" if second == "hand" else ""),
            "r_librpma": show(r1), "r_raw": show(r2),
            "v_librpma": verdict(r1, higher_better), "v_raw": verdict(r2, higher_better),
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
            if v.startswith("slower"):
                items.append(f"- {r['what']} ({r['metric'][:-2]}): slower than {anchor}, "
                             f"ratio {ratio}{' in every repetition' if 'every' in v else ''}")
    return items


LEGEND = """Values: median of the repetitions, ± half their range in % of the median. Ratios:
rpmapp's value over the anchor's in the same repetition (the variants ran back to back,
rotating which went first), median [min–max] of those paired ratios. ↑ = higher is better
(connections/s, MB/s: a ratio above 1 means rpmapp is faster), ↓ = lower is better (ns, µs,
Ir, seconds, MB: a ratio below 1 means rpmapp is cheaper). "slower"/"faster" marks a median
more than 3% off 1; "(every rep)" when every paired ratio agrees. Rows 4 and 6 compare
rpmapp with hand-written code (marked "(hand)" in the "raw librdmacm" column): in row 4 a
sequence making the same provider calls through the same fake, in row 6 verbs
(ibv_post_send / ibv_post_recv / ibv_poll_cq) on a connection made with librdmacm; row 5
compares with librpma only."""


SYSCALL_LEGEND = """Client and server together, per sequential connection (connect, established,
disconnect, closed, release), in the same VM: `strace -f -c` of `bench_connect one VARIANT K`
for K = 5 and K = 25, the difference divided by 20 (so the setup drops out). Counts are
deterministic except for the waits (`epoll_wait`, `poll`, `futex`, `sched_yield`), which
depend on timing. `write` on /dev/infiniband/rdma_cm is one rdma_cm command; `ioctl` on the
uverbs device is one verbs command (CQ, QP, completion channel, memory registration);
`openat` + `newfstatat` + `close` open and close an rdma_cm event channel; a completion
channel is an `ioctl` and a `close`. Rows below 0.5 calls per connection are left out."""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--doc")
    ap.add_argument("--notes")
    args = ap.parse_args()
    groups, meta, syscalls = read(args.files)
    table = rows(groups)
    md = markdown(table)
    print(md)
    sys_md = syscall_table(syscalls)
    if sys_md:
        print("\nsystem calls per connection (client + server, sequential, strace -c):\n" + sys_md)
    servers = serve_names(syscalls, groups)
    serve_md = serve_table(groups)
    if serve_md:
        print("\n7. servers, one client (conc's raw client):\n" + serve_md)
    serve_sys_md = syscall_table(syscalls, tuple("serve:" + n for n in servers), tuple(servers))
    if serve_sys_md:
        print("\nsystem calls per connection, servers (raw client + server, sequential):\n" + serve_sys_md)
    slow = slower_list(table)
    print("\nwhere rpmapp is slower:" if slow else "\nrpmapp is nowhere slower than 3%.")
    for s in slow:
        print(s)
    if not args.doc:
        return 0
    notes = open(args.notes).read() if args.notes else ""
    machine = [
        f"- Date: {meta.get('date', '?')}, commit {meta.get('commit', '?')}",
        f"- Host: {meta.get('cpu', '?')}, {meta.get('host_cpus', '?')} cores shared with other "
        f"jobs, kernel {meta.get('host_kernel', '?')}, {meta.get('compiler', '?')}",
        f"- RDMA (rows 1-3 and 6): {meta.get('rdma_device', '?')}, guest kernel "
        f"{meta.get('guest_kernel', '?')}, {meta.get('guest_cpus', '?')} vCPUs. The VM runs "
        "under TCG (software emulation, no KVM on this host): CPU-bound work runs about 5x "
        "slower than on the host, so absolute numbers say little about real hardware; the "
        "ratios are what to read.",
        "- Rows 4-5 ran on the host.",
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
        f.write("## Results\n\n" + md + "\n\n" + LEGEND + "\n\n")
        if sys_md:
            f.write("## System calls per connection\n\n" + SYSCALL_LEGEND + "\n\n" + sys_md + "\n\n")
        if serve_md:
            f.write("## Servers: the event loop against hand-written ones\n\n" + SERVE_LEGEND + "\n\n"
                    + serve_md + "\n\n")
        if serve_sys_md:
            f.write("System calls per connection, client + server, as above but with the raw client "
                    "for every server (`bench_connect serve-one SERVER K`); the client's calls are "
                    "the same in every column, so the differences are the servers'.\n\n"
                    + serve_sys_md + "\n\n")
        f.write("## Where rpmapp is slower in this run\n\n")
        f.write("\n".join(slow) + "\n\n" if slow else "Nowhere by more than 3%.\n\n")
        f.write(notes)
    print(f"\nwrote {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
