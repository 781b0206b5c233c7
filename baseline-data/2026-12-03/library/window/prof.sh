#!/usr/bin/env bash
# perf profile of the server during a one-device drain: prof.sh TRANSPORT
set -u
t=$1; out=/tmp/perf2/prof-$t
runner --transport $t --workload drain --profile quick --sync none --param orders=600000 --param clients=1 --rounds 1 --out $out.jsonl > $out.md 2>&1 &
rp=$!
for i in $(seq 1 100); do pid=$(pgrep -f "serve --transport $t " | head -1); [ -n "$pid" ] && break; sleep 0.1; done
sleep 2.5
perf record -e cpu-clock -F 2000 -g -p $pid -o $out.data -- sleep 3 2>/dev/null >/dev/null
wait $rp
perf report -i $out.data --no-children --percent-limit 1.2 --stdio -g none 2>/dev/null | grep -v "^#" | grep -v "^$" | head -40 > $out.top
