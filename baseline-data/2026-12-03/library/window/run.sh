#!/usr/bin/env bash
set -u
R=runner
Q=quinn-perf
out=/tmp/perf2
echo "== quinn-perf $(date -u +%T)"
for i in 1 2 3; do
  taskset -c 0 $Q server --listen 127.0.0.1:4433 > $out/qperf-server-$i.log 2>&1 &
  sp=$!
  sleep 1
  taskset -c 1 $Q client 127.0.0.1:4433 --bi-requests 100 --upload-size 64 --download-size 8 --duration 10 > $out/qperf-client-$i.log 2>&1
  kill $sp; wait $sp 2>/dev/null
  tail -12 $out/qperf-client-$i.log
done
echo "== suite quinn/s2n-quic drain, one device, sync none $(date -u +%T)"
$R --transport quinn,s2n-quic --workload drain --profile quick --sync none --param orders=200000 --param clients=1 \
  --rounds 3 --out $out/drain-one-device.jsonl > $out/drain-one-device.md 2>&1
echo "== done $(date -u +%T)"
