#!/usr/bin/env bash
# The cluster table of docs/benchmarks.md: `gorge-bench cluster` for each engine × nodes ×
# rate, one run each, in one session, then the Redis-paused run; one JSON line per run in
# $RESULTS (default /tmp/gorge-cluster-results.jsonl) and the table in markdown on stdout.
# Usage: cluster_matrix.sh [nodes...]   (default 2 3 5)
# Env: BIN (release binaries, default target/release), SOCKETS (per node, default 1000),
#      MEASURED (timed sockets per node, default 10), SECONDS_PER_RUN (posting time, default 10),
#      RATES (default "50 500 2000"), ENGINES (default "redis mesh"), OLD_BINARY (an
#      older gorge-notification: its Redis runs on 3 nodes at every rate go in the same table,
#      marked "before").
# Needs: cargo build --release -p gorge-bench -p gorge-notification; redis-server on PATH.
# Run it under `flock /work/wt/bench.lock` on a shared machine.
set -u
cd "$(dirname "$0")/../.." || exit 1
BIN=${BIN:-target/release}
RESULTS=${RESULTS:-/tmp/gorge-cluster-results.jsonl}
SOCKETS=${SOCKETS:-1000}
MEASURED=${MEASURED:-10}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}
RATES=${RATES:-50 500 2000}
ENGINES=${ENGINES:-redis mesh}
NODES=${*:-2 3 5}
: >"$RESULTS"

run() { # label -- bench args...
  local label=$1; shift 2
  local line
  line=$("$BIN/gorge-bench" cluster --sockets "$SOCKETS" --measured "$MEASURED" "$@" \
    2>>/tmp/gorge-cluster-stderr.log | tail -n 1)
  echo "$line" | jq -c --arg l "$label" '. + {label: $l}' >>"$RESULTS"
  echo "$label: $(echo "$line" | cut -c1-120)" >&2
}

for rate in $RATES; do
  for nodes in $NODES; do
    for engine in $ENGINES; do
      messages=$((rate * SECONDS_PER_RUN))
      run "$engine-$nodes-$rate" -- --engine "$engine" --nodes "$nodes" --rate "$rate" \
        --messages "$messages" --timeout 240
    done
  done
done
if [ -n "${OLD_BINARY:-}" ]; then
  for rate in $RATES; do
    run "old-redis-3-$rate" -- --engine redis --nodes 3 --rate "$rate" \
      --messages $((rate * SECONDS_PER_RUN)) --timeout 240 --binary "$OLD_BINARY"
  done
fi
# Redis SIGSTOPped 10 s under load (3 000 messages in 15 s at 200/s: 2 000 while paused,
# within the default publish queue of 4 096).
run "redis-3-paused" -- --engine redis --nodes 3 --rate 200 --messages 3000 \
  --pause-redis-ms 10000 --pause-after-ms 2000 --settle-ms 20000 --timeout 240
# The same at 500/s: 5 000 messages while paused, so the queue is raised to 8 192.
run "redis-3-paused-500" -- --engine redis --nodes 3 --rate 500 --messages 7500 \
  --pause-redis-ms 10000 --pause-after-ms 2000 --settle-ms 20000 --timeout 240 --broker-queue 8192

echo "| engine | nodes | msg/s | admin POST p50 / p99 ms | cross-node p50 / p99 / max ms | local p50 / p99 ms | CPU µs/msg: entry / other servers / redis | lost / dup | load avg |"
echo "|---|---|---|---|---|---|---|---|---|"
jq -r 'select(.redis_paused == null) |
  def r: . * 100 | round / 100;
  def cpu(p): [.cpu[] | select(.process | test(p)) | .cpu_us_per_message | round] ;
  "| \(.engine)\(if (.label | startswith("old-")) then " (before)" else "" end) | \(.nodes) | \(.rate | round) | \(.admin_post_ms.p50_ms | r) / \(.admin_post_ms.p99_ms | r) | \(.cross_node_post_to_frame_ms.p50_ms | r) / \(.cross_node_post_to_frame_ms.p99_ms | r) / \(.cross_node_post_to_frame_ms.max_ms | r) | \(.local_post_to_frame_ms.p50_ms | r) / \(.local_post_to_frame_ms.p99_ms | r) | \(cpu("cluster-0")[0]) / \(cpu("cluster-[1-9]") | "\(min)–\(max)") / \(cpu("redis")[0] // "—") | \(.lost.local + .lost.cross_node) / \(.duplicates.local + .duplicates.cross_node) | \(.load_average.posting_start) |"' "$RESULTS"
echo
jq -r 'select(.redis_paused != null) | .redis_paused as $p |
  "Redis paused \($p.paused_s) s under \(.rate) msg/s (\(.nodes) nodes): \($p.messages_posted_while_paused) messages posted meanwhile; lost frames \($p.lost_frames), duplicate frames \($p.duplicate_frames); lateness (POST → last cross-node frame) p50 \($p.lateness_ms.p50_ms) ms, p99 \($p.lateness_ms.p99_ms) ms, max \($p.lateness_ms.max_ms) ms; the last of them arrived \($p.all_delivered_after_resume_ms) ms after the resume; whole run lost \(.lost.local + .lost.cross_node), duplicates \(.duplicates.local + .duplicates.cross_node), POST errors \(.post_errors)"' "$RESULTS"
