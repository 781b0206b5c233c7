#!/usr/bin/env python3
"""The load generator's instructions per order, or the server's, counted with callgrind (docs/performance.md, "The
device's work per order, counted").

    scripts/generator-instructions.py [--runner target/release/runner] [--transport quinn[,s2n-quic,...]]
                                      [--clients 16] [--orders 20000] [--top 30] [--keep DIR]
                                      [--side generator|server|generator,server] [--out FILE]

Runs the drain twice under callgrind, with ORDERS and with twice as many (`--workload drain --sync none --profile
quick`), the runner's own process (the generator) counted and the server it starts not (`--trace-children=no`).
The difference of each function's instructions between the two runs, divided by ORDERS, is what one more order
costs the generator. Printed: that total; the drain's part, without the functions of work the drain's steady part
does not contain but that grows with the order count (making the backlog's orders and the device's table of them,
the audit of the store's log after the drain, aws-lc's jitter entropy at start), listed below by name; and the
functions that cost the most per order.

With `--side server` both processes run under callgrind (`--trace-children=yes`) and the server's (`runner serve`)
is counted; the generator then is no longer the only slow one, and the counts are those of a server that is fed
at about its own pace.

Exits non-zero if either run re-sent, lost or left an order unanswered (a connection given up under callgrind's
slowness would count its handshake and re-sends as per-order work). Under callgrind the generator is the
bottleneck, so the generator's counts are those of a saturated generator. The counts of one build stay within
about 3% of their median (a server's batching follows the pace of two slowed processes). Needs valgrind.

With `--out FILE` each transport and side is appended to FILE as an icount record (schema icount/1, scenario
`drain/SIDE/TRANSPORT/devices=N`, the drain's part per order), so the icount tool compares it with a baseline:
CI counts quinn and mqtt, both sides, and holds them to baseline-data/icount/drain.jsonl within 6%
(`target/release/icount compare --tolerance 6 baseline-data/icount/drain.jsonl FILE`). To renew that baseline,
`--repeat 3 --out` (the median of three counts) on the new build, and commit it with the change.
"""

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

# Functions of work that grows with the order count but is not in the drain's steady part, by name: the backlog's
# orders made and pushed into the devices' tables before the server is continued, the audit afterwards (reading the
# store's log, its CRCs, hash sets of ids), and the entropy source aws-lc seeds itself from (a time-dependent loop).
SETUP = (
    "jent_", "jitterentropy", "rol64", "xoshiro", "uint32rotl", "ptr_to_le32",
    "harness::order", "sender_id", "core::fmt", "alloc::fmt", "Formatter", "as core::fmt::Write", "Display>::fmt",
    "Audit", "read_log", "read_full", "crc32", "hash_one", "Hasher::write_usize", "Filter<I,P>",
    "Orders::push", "BTreeMap<K,V,A>::insert", "BTreeMap<K,V,A>::remove", "btree::remove::",
    "HashMap<K,V,S,A>::insert", "EVP_PKEY_keygen", "ids::Runs>", "finish_grow",
)

LINE = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$")


def run(runner, transport, clients, orders, out, side):
    """Run one drain under callgrind; the callgrind output of `side`'s process is left at `out`."""
    children = "yes" if side == "server" else "no"
    cmd = [
        "valgrind", "--tool=callgrind", f"--trace-children={children}", f"--callgrind-out-file={out}.%p",
        runner, "--transport", transport, "--workload", "drain", "--sync", "none", "--profile", "quick",
        "--param", f"orders={orders}", "--param", f"clients={clients}", "--rounds", "1",
        "--out", out + ".jsonl",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    text = done.stdout + done.stderr
    if done.returncode != 0:
        sys.exit(f"the drain of {orders} orders failed under callgrind:\n{text[-2000:]}")
    for key in ("client_resent_timeout", "client_resent_reconnect", "unanswered", "lost"):
        m = re.search(rf"{key}=(\d+)", text)
        if not m:
            sys.exit(f"no {key} in the runner's output")
        if int(m.group(1)) != 0:
            sys.exit(f"the drain of {orders} orders had {key}={m.group(1)}: not a clean count")
    # One output per process: the runner's (the generator), and with children traced the server's (`runner serve`).
    directory, base = os.path.split(out)
    for name in os.listdir(directory):
        if not name.startswith(base + ".") or name.endswith(".jsonl"):
            continue
        path = os.path.join(directory, name)
        with open(path, errors="replace") as f:
            command = next((line for line in f if line.startswith("cmd:")), "")
        if (" serve " in command) == (side == "server"):
            os.replace(path, out)
        else:
            os.remove(path)
    if not os.path.exists(out):
        sys.exit(f"no callgrind output of the {side}'s process")


def functions(path):
    """Self instructions per function of one callgrind output."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", path],
        capture_output=True, text=True, check=True,
    ).stdout
    costs = Counter()
    for line in text.splitlines():
        m = LINE.match(line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        # "file:function [object]": the same function inlined from several files is summed.
        name = re.sub(r" \[[^\]]*\]$", "", m.group(2)).split(":", 1)[-1]
        costs[name] += int(m.group(1).replace(",", ""))
    return costs


def provenance(icount):
    """What a count depends on besides the code, as the icount tool records it (`icount provenance`)."""
    out = subprocess.run([icount, "provenance"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def count(a, transport, side, repetition, work):
    """Count one transport's side: (all instructions per order, the drain's part, per function)."""
    small, large = (
        os.path.join(work, f"callgrind.{transport}.{side}.{repetition}.{n}") for n in (a.orders, 2 * a.orders)
    )
    run(a.runner, transport, a.clients, a.orders, small, side)
    run(a.runner, transport, a.clients, 2 * a.orders, large, side)
    before, after = functions(small), functions(large)
    per_order = {f: (after[f] - before.get(f, 0)) / a.orders for f in after}
    # The server has no backlog to make and no audit to run: all of its work per order is the drain's.
    setup = SETUP if side == "generator" else ()
    drain = {f: v for f, v in per_order.items() if not any(s in f for s in setup)}
    if not a.keep:
        for path in (small, large):
            for suffix in ("", ".jsonl"):
                if os.path.exists(path + suffix):
                    os.remove(path + suffix)
    return sum(per_order.values()), drain


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runner", default="target/release/runner")
    p.add_argument("--transport", default="quinn", help="one transport or several, comma-separated")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--orders", type=int, default=20000)
    p.add_argument("--top", type=int, default=30)
    p.add_argument(
        "--side", default="generator",
        help="whose instructions: `generator` (the runner's process), `server` (both run under callgrind), or both "
        "(`generator,server`)",
    )
    p.add_argument("--keep", help="keep callgrind's outputs in this directory")
    p.add_argument(
        "--out", help="append one icount record per transport and side to this file (JSON lines, icount/1: compare "
        "with `icount compare BASELINE FILE`)",
    )
    p.add_argument("--icount", default="target/release/icount", help="the icount tool (the provenance of the records, for --out)")
    p.add_argument(
        "--jobs", type=int, default=1,
        help="counts run at once (2 on 2 cores: each count's pace is shared by both its processes, so the counts "
        "stay within their spread; docs/performance.md)",
    )
    p.add_argument(
        "--repeat", type=int, default=1,
        help="count each transport and side this many times and keep the median (to renew a baseline: 3)",
    )
    a = p.parse_args()
    if a.repeat < 1 or a.jobs < 1:
        sys.exit("--repeat and --jobs: at least 1")
    sides = a.side.split(",")
    if any(side not in ("generator", "server") for side in sides):
        sys.exit(f"--side: `generator`, `server` or both, not `{a.side}`")
    if a.out and not os.path.exists(a.icount):
        sys.exit(f"--out needs the icount tool for the records' provenance, not found at {a.icount} (cargo build --release -p icount)")
    made = provenance(a.icount) if a.out else None

    work = a.keep or tempfile.mkdtemp(prefix="generator-instructions-")
    os.makedirs(work, exist_ok=True)
    pairs = [(transport, side) for transport in a.transport.split(",") for side in sides]
    tasks = [(transport, side, r) for transport, side in pairs for r in range(a.repeat)]
    # Each count is its own processes and files, so counts can run side by side (--jobs).
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        done = dict(zip(tasks, pool.map(lambda t: count(a, *t, work), tasks)))
    for transport, side in pairs:
        counts = sorted((done[(transport, side, r)] for r in range(a.repeat)), key=lambda c: sum(c[1].values()))
        if a.repeat > 1:
            print(f"{transport}, {side}, the drain's part of {a.repeat} counts: "
                  + ", ".join(f"{sum(c[1].values()):,.0f}" for c in counts))
        total, drain = counts[len(counts) // 2]
        part = sum(drain.values())
        print(f"{transport}, {a.clients} devices, {a.orders} and {2 * a.orders} orders ({a.runner})")
        print(f"{side} instructions per order: {total:,.0f}; the drain's part: {part:,.0f}")
        if a.top:
            print(f"\n| instructions per order | function (the drain's part) |\n|---:|---|")
            for f, v in sorted(drain.items(), key=lambda kv: -kv[1])[: a.top]:
                print(f"| {v:,.1f} | `{f[:120]}` |")
            print()
        if a.out:
            record = {
                "schema": "icount/1",
                "scenario": f"drain/{side}/{transport}/devices={a.clients}",
                "instructions_per_op": round(part, 1),
                "instructions": round(part * a.orders),
                "iterations": a.orders,
                **made,
            }
            with open(a.out, "a") as f:
                f.write(json.dumps(record) + "\n")
    if not a.keep:
        os.rmdir(work)


if __name__ == "__main__":
    main()
