#!/usr/bin/env bash
# The webhook replica table of docs/benchmarks.md: `gorge-bench webhook` for 1 and 4
# processes in each scenario, each build, ROUNDS rounds with the builds alternating cell by
# cell; one JSON line per run in $RESULTS (default /tmp/gorge-webhook-results.jsonl), then
# the medians as a markdown table on stdout.
# Usage: webhook_matrix.sh <dir>/gorge-webhook...   (each build's label: its directory's name)
# Env: BIN (gorge-bench's dir, default target/release), ROUNDS (default 5), ROWS (default
#      20000), HOOKS (default 100), NGINX (URL of a local nginx answering 200, default
#      http://127.0.0.1:18931), BUDGET (CPUs per process for the "own CPU" rows, default
#      0.25), SCENARIOS (default "nginx tls budget").
# Scenarios: nginx = plain HTTP to nginx, all processes sharing the machine; tls = HTTPS to
#      the bench's receiver with a private CA; budget = nginx with every process held to
#      BUDGET CPUs by a cgroup quota (as replicas on machines of their own; needs root).
# Run it under `flock /work/wt/bench.lock` on a shared machine.
set -u
cd "$(dirname "$0")/../.." || exit 1
BIN=${BIN:-target/release}
RESULTS=${RESULTS:-/tmp/gorge-webhook-results.jsonl}
ROUNDS=${ROUNDS:-5}
ROWS=${ROWS:-20000}
HOOKS=${HOOKS:-100}
NGINX=${NGINX:-http://127.0.0.1:18931}
BUDGET=${BUDGET:-0.25}
SCENARIOS=${SCENARIOS:-nginx tls budget}
[ $# -ge 1 ] || { echo "usage: $0 <gorge-webhook binary>..." >&2; exit 2; }
: >"$RESULTS"

for round in $(seq 1 "$ROUNDS"); do
  for scenario in $SCENARIOS; do
    case $scenario in
      nginx) extra=(--target-url "$NGINX") ;;
      tls) extra=(--tls) ;;
      budget) extra=(--target-url "$NGINX" --cpus-per-process "$BUDGET") ;;
      *) echo "unknown scenario $scenario" >&2; exit 2 ;;
    esac
    for processes in 1 4; do
      for binary in "$@"; do
        build=$(basename "$(dirname "$binary")")
        load=$(cut -d' ' -f1 /proc/loadavg)
        line=$("$BIN/gorge-bench" webhook --processes "$processes" --hooks "$HOOKS" \
          --rows "$ROWS" --max-concurrent 16 --timeout 180 --binary "$binary" "${extra[@]}" \
          2>>/tmp/gorge-webhook-stderr.log | tail -n 1)
        echo "$line" | jq -c --arg s "$scenario" --arg b "$build" --argjson r "$round" \
          --argjson l "$load" '{scenario: $s, build: $b, round: $r, load: $l} + .' >>"$RESULTS"
        echo "round $round $scenario P=$processes $build: $(echo "$line" | jq -c \
          '[.ok, .deliveries_per_s, .webhook_cpu_us_per_delivery, .mariadb_cpu_us_per_delivery]')" >&2
      done
    done
  done
done

echo "| scenario | build | processes | deliveries/s median (runs) | gorge CPU µs/row | MariaDB CPU µs/row | statements/row | duplicates | max per hook | all ok |"
echo "|---|---|---|---|---|---|---|---|---|---|"
jq -rs '
  def med: sort | .[(length - 1) / 2 | floor];
  def r: . * 10 | round / 10;
  group_by([.scenario, .build, .processes])[] |
  "| \(.[0].scenario) | \(.[0].build) | \(.[0].processes) | \(map(.deliveries_per_s) | med | round) (\(map(.deliveries_per_s | round | tostring) | join(" / "))) | \(map(.webhook_cpu_us_per_delivery) | med | r) | \(map(.mariadb_cpu_us_per_delivery) | med | r) | \(map(.statements_per_delivery.Questions) | med) | \(map(.duplicates) | max) | \(map(.max_concurrent_per_hook) | max) | \(all(.ok)) |"
' "$RESULTS"
