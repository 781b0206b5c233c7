#!/usr/bin/env python3
"""The load generator's instructions per order, or the server's, counted with callgrind (docs/performance.md, "The
device's work per order, counted").

    scripts/generator-instructions.py [--runner target/release/runner] [--transport quinn] [--clients 16]
                                      [--orders 20000] [--top 30] [--keep DIR] [--side generator|server]

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
slowness would count its handshake and re-sends as per-order work). The counts of one build repeat within about
10 instructions per order; under callgrind the generator is the bottleneck, so they are those of a saturated
generator. Needs valgrind.
"""

import argparse
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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runner", default="target/release/runner")
    p.add_argument("--transport", default="quinn")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--orders", type=int, default=20000)
    p.add_argument("--top", type=int, default=30)
    p.add_argument(
        "--side", choices=("generator", "server"), default="generator",
        help="whose instructions: the generator's (the runner's process), or the server's (both run under callgrind)",
    )
    p.add_argument("--keep", help="keep callgrind's outputs in this directory")
    a = p.parse_args()

    work = a.keep or tempfile.mkdtemp(prefix="generator-instructions-")
    os.makedirs(work, exist_ok=True)
    small, large = (os.path.join(work, f"callgrind.{n}") for n in (a.orders, 2 * a.orders))
    run(a.runner, a.transport, a.clients, a.orders, small, a.side)
    run(a.runner, a.transport, a.clients, 2 * a.orders, large, a.side)
    before, after = functions(small), functions(large)
    per_order = {f: (after[f] - before.get(f, 0)) / a.orders for f in after}
    total = sum(per_order.values())
    # The server has no backlog to make and no audit to run: all of its work per order is the drain's.
    setup = SETUP if a.side == "generator" else ()
    drain = {f: v for f, v in per_order.items() if not any(s in f for s in setup)}

    print(f"{a.transport}, {a.clients} devices, {a.orders} and {2 * a.orders} orders ({a.runner})")
    print(f"{a.side} instructions per order: {total:,.0f}; the drain's part: {sum(drain.values()):,.0f}")
    print(f"\n| instructions per order | function (the drain's part) |\n|---:|---|")
    for f, v in sorted(drain.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"| {v:,.1f} | `{f[:120]}` |")
    if not a.keep:
        for path in (small, large):
            for suffix in ("", ".jsonl"):
                if os.path.exists(path + suffix):
                    os.remove(path + suffix)
        os.rmdir(work)


if __name__ == "__main__":
    main()
