#!/usr/bin/env python3
"""Seed 002's Amdahl table from one handshake-rate invocation over `T:p256` and `T:p256-rustcrypto` pairs.

    scripts/p256-amdahl.py RESULTS.jsonl

Prints two Markdown tables:

1. The arithmetic: each P-256 operation's cost with aws-lc-rs (assembly) and with RustCrypto p256, as the runs
   measured them in-process with the servers' own provider code (`asym_cost_*_us`, medians over every run of each
   side), their ratio, and the server's arithmetic per handshake (its counted operations at those costs).
2. Per transport and worker count, medians over rounds: the handshake rate of each side and their ratio, the server's
   CPU per handshake of each side and their ratio, and the arithmetic's ratio beside them: how much of the
   arithmetic's gain reaches the handshakes.
"""

import json
import statistics
import sys
from collections import defaultdict

ASM, RC = ":p256", ":p256-rustcrypto"


def median(xs):
    return statistics.median(xs) if xs else None


def fmt(x, digits=1):
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def main(path):
    runs = [json.loads(line) for line in open(path) if line.strip()]
    runs = [r for r in runs if r["workload"] == "handshake-rate" and not r.get("skipped")]
    side = lambda t: "asm" if t.endswith(ASM) else "rc" if t.endswith(RC) else None
    costs = defaultdict(list)
    for r in runs:
        s = side(r["transport"])
        if s is None:
            continue
        for op in ["ecdh", "sign", "verify"]:
            v = r["metrics"].get(f"asym_cost_{op}_us")
            if v is not None:
                costs[(s, op)].append(v)
    print("| operation (µs, in-process, median of every run) | aws-lc-rs (asm) | RustCrypto p256 0.14 | ratio |")
    print("|---|---:|---:|---:|")
    names = {"ecdh": "P-256 ECDH (key generation and agreement averaged)", "sign": "ECDSA P-256 sign",
             "verify": "ECDSA P-256 verify (key parsed for it)"}
    per = {}
    for op in ["ecdh", "sign", "verify"]:
        a, b = median(costs[("asm", op)]), median(costs[("rc", op)])
        per[op] = (a, b)
        print(f"| {names[op]} | {fmt(a)} | {fmt(b)} | {fmt(b / a if a and b else None, 2)}x |")
    # The server's operations per handshake, as counted (2 ECDH, 1 sign, 2 verify with a client certificate).
    ops = defaultdict(list)
    for r in runs:
        m = r["metrics"]
        links = m.get("links") or 0
        if links:
            for op in ["ecdh", "sign", "verify", "x25519"]:
                ops[op].append(m.get(f"server_{op}", 0) / links)
    counted = {op: median(v) for op, v in ops.items()}
    est = lambda s: sum(counted[op] * per[op][s] for op in ["ecdh", "sign", "verify"])
    a, b = est(0), est(1)
    label = ", ".join(f"{fmt(counted[op], 2)} {op}" for op in ["ecdh", "sign", "verify"])
    print(f"| server's arithmetic per handshake ({label}) | {fmt(a)} | {fmt(b)} | {fmt(b / a, 2)}x |")
    print()

    groups = defaultdict(list)
    for r in runs:
        s = side(r["transport"])
        if s is not None:
            base = r["transport"][: -len(ASM if s == "asm" else RC)]
            groups[(base, r["params"]["workers"], s)].append(r["metrics"])
    print("| transport | workers | conn/s asm | conn/s RustCrypto | rate ratio | server CPU µs/handshake asm | "
          "RustCrypto | CPU ratio | arithmetic ratio | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for base, workers in sorted({(b, w) for b, w, _ in groups}):
        get = lambda s, k: median([m[k] for m in groups[(base, workers, s)] if k in m])
        rate_a, rate_b = get("asm", "conn_per_s"), get("rc", "conn_per_s")
        cpu_a, cpu_b = get("asm", "server_cpu_us_per_conn"), get("rc", "server_cpu_us_per_conn")
        ar_a = get("asm", "server_asym_cost_us_per_conn")
        ar_b = get("rc", "server_asym_cost_us_per_conn")
        errors = sum(m.get("errors", 0) for s in ["asm", "rc"] for m in groups[(base, workers, s)])
        ratio = lambda x, y: fmt(x / y, 2) + "x" if x and y else "-"
        print(f"| {base} | {workers} | {fmt(rate_a)} | {fmt(rate_b)} | {ratio(rate_a, rate_b)} | {fmt(cpu_a)} | "
              f"{fmt(cpu_b)} | {ratio(cpu_b, cpu_a)} | {ratio(ar_b, ar_a)} | {errors} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
