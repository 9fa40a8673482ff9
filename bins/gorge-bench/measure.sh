#!/usr/bin/env bash
# Runs the scenarios published in docs/benchmarks.md and appends one JSON line per run
# (the bench's summary plus "scenario" and "run") to $RESULTS (default
# /tmp/gorge-bench-results.jsonl). Usage: measure.sh [notify|notify10k|large|flood|hogs|webhook|drills|profile|all] [runs]
# Needs release builds: cargo build --release -p gorge-bench -p gorge-notification -p gorge-webhook
set -u
cd "$(dirname "$0")/../.." || exit 1
BIN=${BIN:-target/release}
RESULTS=${RESULTS:-/tmp/gorge-bench-results.jsonl}
RUNS=${2:-3}
CLIENT_PORT=24280
ADMIN_PORT=24281

record() { # scenario run -- command...
  local scenario=$1 run=$2; shift 3
  local line
  line=$("$@" 2>>/tmp/gorge-bench-stderr.log | tail -n 1)
  echo "$line" | jq -c --arg s "$scenario" --argjson r "$run" '. + {scenario: $s, run: $r}' >>"$RESULTS"
  echo "$scenario#$run: $(echo "$line" | cut -c1-160)"
}

start_notification() {
  # The server needs as many descriptors as the bench opens sockets. $PIN (e.g.
  # "taskset -c 0") runs it on fewer CPUs: tokio then starts one worker per CPU it may use.
  # With $APHLICT (the path of Phorge's support/aphlict/server/aphlict_server.js, its `ws`
  # module installed beside it) the server is Aphlict instead, started as `bin/aphlict`
  # starts it (node --max-old-space-size=256, a config file with both servers).
  local ready="readyz" log=/tmp/gorge-bench-notification.log
  local server=("$BIN/gorge-notification")
  if [ -n "${APHLICT:-}" ]; then
    ready="status/" log=/tmp/gorge-bench-aphlict.log
    printf '{"servers":[{"type":"client","port":%s,"listen":"127.0.0.1"},{"type":"admin","port":%s,"listen":"127.0.0.1"}],"logs":[],"cluster":[],"pidfile":"/tmp/gorge-bench-aphlict.pid"}\n' \
      "$CLIENT_PORT" "$ADMIN_PORT" >/tmp/gorge-bench-aphlict.json
    server=(node --max-old-space-size=256 "$APHLICT" --config=/tmp/gorge-bench-aphlict.json)
  fi
  # (Aphlict ignores the GORGE_ variables.)
  ( ulimit -n 200000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
    GORGE_NOTIFICATION_LISTEN_ADDR=127.0.0.1 GORGE_NOTIFICATION_CLIENT_PORT=$CLIENT_PORT \
    GORGE_NOTIFICATION_ADMIN_PORT=$ADMIN_PORT GORGE_LOG_LEVEL=warn \
    exec ${PIN:-} "${server[@]}" >>"$log" 2>&1 ) &
  SERVER_PID=$!
  for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$ADMIN_PORT/$ready" >/dev/null && return 0
    sleep 0.1
  done
  echo "notification server did not become ready" >&2
  return 1
}

stop_notification() { kill -9 "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; }

notify_scenario() { # name runs -- bench args...
  local name=$1 runs=$2; shift 3
  for run in $(seq "$runs"); do
    start_notification || return 1
    record "$name" "$run" -- "$BIN/gorge-bench" notify --client "ws://127.0.0.1:$CLIENT_PORT/" \
      --admin "http://127.0.0.1:$ADMIN_PORT/" --pid "$SERVER_PID" "$@"
    stop_notification
  done
}

notify_10k() {
  notify_scenario notify-10k-all "$RUNS" -- --sockets 10000 --messages 100 --rate 10 --fanout all --timeout 120
  notify_scenario notify-10k-one "$RUNS" -- --sockets 10000 --messages 3000 --rate 500 --fanout one --timeout 120
}

notify_all() {
  notify_scenario notify-1k-all "$RUNS" -- --sockets 1000 --messages 300 --rate 50 --fanout all --timeout 60
  notify_scenario notify-1k-one "$RUNS" -- --sockets 1000 --messages 3000 --rate 500 --fanout one --timeout 60
  notify_10k
  # Admin latency with 1 000 stuck sockets, against the same load without them. Few readers,
  # so that the figure shows the stuck sockets' effect rather than fan-out CPU.
  notify_scenario notify-100-nostuck "$RUNS" -- --sockets 100 --messages 600 --rate 100 \
    --payload-bytes 4096 --fanout all --timeout 60
  notify_scenario notify-100-stuck1k "$RUNS" -- --sockets 100 --stuck 1000 --messages 600 --rate 100 \
    --payload-bytes 4096 --fanout all --timeout 60
}

# 50 000 sockets need RLIMIT_NOFILE above 50 000 for both processes; this machine's hard
# limit is 20 000 and raising it needs CAP_SYS_RESOURCE, so the largest run is 18 000.
notify_large() {
  local sockets=${LARGE_SOCKETS:-18000}
  notify_scenario "notify-${sockets}-all" 1 -- --sockets "$sockets" --messages 20 --rate 2 --fanout all \
    --connect-concurrency 512 --timeout 240
}

# Anonymous sockets flooding each kind of frame (reconnecting when closed) while an admin
# POST is made every 100 ms: 1, 4 and 32 sockets on both CPUs, then 1 and 32 with the server
# pinned to one CPU (one tokio worker, as in a 1-CPU container). FLOODER_NICE=19 runs the
# flooding threads at the lowest priority: they stand for remote machines, whose CPU (and
# the kernel's loopback TCP work, done in the sending thread) is not this box's.
flood_scenario() { # name -- bench args...
  local name=$1; shift 2
  start_notification || return 1
  record "$name" 1 -- "$BIN/gorge-bench" flood --client "ws://127.0.0.1:$CLIENT_PORT/" \
    --admin "http://127.0.0.1:$ADMIN_PORT/" --pid "$SERVER_PID" --seconds "${FLOOD_SECONDS:-8}" \
    --flooder-nice "${FLOODER_NICE:-0}" "$@"
  stop_notification
}

# The subscription total attacked (issue 21 item 8): 600 sockets × 4 096 PHIDs of 32 bytes
# (each socket's 512 KiB; together past the 256 MiB total), a newcomer's message, and RSS
# idle, at the peak and for 10 s after the hogs close.
hogs_all() {
  start_notification || return 1
  record hogs-600 1 -- "$BIN/gorge-bench" hogs --client "ws://127.0.0.1:$CLIENT_PORT/" \
    --admin "http://127.0.0.1:$ADMIN_PORT/" --pid "$SERVER_PID" --sockets 600 --phids 4096 \
    --phid-bytes 32 --settle-seconds 10 --timeout 300
  stop_notification
}

flood_all() {
  local frame sockets
  for frame in replay subscribe ping tiny-text binary ws-ping; do
    for sockets in 1 4 32; do
      flood_scenario "flood-$frame-$sockets" -- --frame "$frame" --sockets "$sockets" --timeout 60
    done
  done
  for frame in replay subscribe ping tiny-text binary ws-ping; do
    for sockets in 1 32; do
      PIN="taskset -c 0" flood_scenario "flood-1cpu-$frame-$sockets" -- --frame "$frame" \
        --sockets "$sockets" --timeout 60
    done
  done
}

webhook_all() {
  for run in $(seq "$RUNS"); do
    record webhook-20k-1p "$run" -- "$BIN/gorge-bench" webhook --processes 1 --hooks 100 --rows 20000 --timeout 240
  done
  for run in $(seq "$RUNS"); do
    record webhook-20k-4p "$run" -- "$BIN/gorge-bench" webhook --processes 4 --hooks 100 --rows 20000 --timeout 240
  done
  record webhook-trickle 1 -- "$BIN/gorge-bench" webhook --trickle --rows 100 --trickle-interval-ms 100 --hooks 10 --timeout 90
}

# Where the CPU goes, for the figures that miss their targets: perf on the notification
# server during a 10k fan-out, and on one webhook process during a drain.
profile_all() {
  start_notification || return 1
  perf record -F 499 -p "$SERVER_PID" -o /tmp/gorge-notification.perf.data -- sleep 30 >/dev/null 2>&1 &
  local perf_pid=$!
  record notify-10k-all-profiled 1 -- "$BIN/gorge-bench" notify --client "ws://127.0.0.1:$CLIENT_PORT/" \
    --admin "http://127.0.0.1:$ADMIN_PORT/" --pid "$SERVER_PID" --sockets 10000 --messages 200 --rate 10 --timeout 60
  wait "$perf_pid"
  stop_notification
  perf report -i /tmp/gorge-notification.perf.data --stdio --sort dso,sym --percent-limit 0.7 \
    2>/dev/null | grep -v '^$' | head -150 >/tmp/gorge-notification.perf.txt

  # The webhook process is started by the bench: find it, then profile it for 20 s.
  record webhook-20k-1p-profiled 1 -- "$BIN/gorge-bench" webhook --processes 1 --hooks 100 --rows 20000 --timeout 120 &
  local bench_pid=$! webhook_pid=""
  for _ in $(seq 100); do
    webhook_pid=$(pgrep -n -f "$BIN/gorge-webhook") && break
    sleep 0.1
  done
  [ -n "$webhook_pid" ] && perf record -F 499 -p "$webhook_pid" -o /tmp/gorge-webhook.perf.data -- sleep 20 >/dev/null 2>&1
  wait "$bench_pid"
  perf report -i /tmp/gorge-webhook.perf.data --stdio --sort dso,sym --percent-limit 0.7 \
    2>/dev/null | grep -v '^$' | head -150 >/tmp/gorge-webhook.perf.txt
}

drills_all() { record drills 1 -- "$BIN/gorge-bench" drill all --timeout 600; }

case "${1:-all}" in
  notify) notify_all ;;
  notify10k) notify_10k ;;
  large) notify_large ;;
  flood) flood_all ;;
  hogs) hogs_all ;;
  webhook) webhook_all ;;
  drills) drills_all ;;
  profile) profile_all ;;
  all) notify_all; webhook_all; drills_all; notify_large ;;
  *) echo "usage: $0 [notify|notify10k|large|flood|hogs|webhook|drills|profile|all] [runs]" >&2; exit 2 ;;
esac
