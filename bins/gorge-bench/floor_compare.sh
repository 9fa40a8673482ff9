#!/bin/bash
# Runs the same notify scenarios against the floor (`gorge-bench floor`), this build of
# gorge-notification, optionally a previous build and optionally Aphlict, one after the other
# on fresh processes, and appends each JSON summary (plus "server", "scenario", "binary" and
# "round") to $OUT. Print the table (medians over rounds, ratios to the floor's median) with
#   OUT=... bins/gorge-bench/floor_compare.sh table
#
#   NEW=target/release/gorge-notification OLD=/path/to/old/gorge-notification \
#   APHLICT=/path/to/phorge/support/aphlict/server/aphlict_server.js \
#   BENCH=target/release/gorge-bench SOCKETS=2000 LIVE="5000 10000" ROUNDS=3 \
#   bins/gorge-bench/floor_compare.sh
#
# SERVERS limits the servers (floor new old aphlict, or name=/path/to/gorge-notification for
# any other build; the default is floor, new, and old / aphlict when their path is set), SCENARIOS limits the scenarios (burst live batched stuck),
# ROUNDS repeats everything (servers interleaved within each round, so a noisy minute does
# not land on one server only), PRELOAD=path runs gorge under another allocator
# (LD_PRELOAD). APHLICT is the path of Phorge's own aphlict_server.js with its `ws` module
# installed beside it (this script does not install it). Loopback only; every run ends
# within its --timeout.
set -eu

BENCH=${BENCH:-target/release/gorge-bench}
NEW=${NEW:-target/release/gorge-notification}
OLD=${OLD:-}
APHLICT=${APHLICT:-}
OUT=${OUT:-/tmp/gorge-floor-compare.jsonl}
SOCKETS=${SOCKETS:-2000}
LIVE=${LIVE:-5000}
ROUNDS=${ROUNDS:-1}
CLIENT_PORT=${CLIENT_PORT:-22380}
ADMIN_PORT=${ADMIN_PORT:-22381}
PRELOAD=${PRELOAD:-}

if [ "${1:-}" = table ]; then
    exec python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def g(r, *path):
    for p in path:
        r = r.get(p) if isinstance(r, dict) else None
    return r
FIGURES = {
    "cpu": lambda r: g(r, "server_cpu_us_per_frame"),
    "p99": lambda r: g(r, "post_to_frame_ms", "p99_ms"),
    "post": lambda r: g(r, "admin_post_ms", "p99_ms"),
    "srvpost": lambda r: g(r, "server_metrics", "admin_post_p99_le_ms"),
    "idle": lambda r: g(r, "server_rss_per_socket_bytes"),
    "after": lambda r: g(r, "server_rss_per_socket_end_bytes"),
}
groups = {}
for r in rows:
    groups.setdefault((r["scenario"], r["server"]), []).append(r)
def values(runs, key):
    return [v for v in (FIGURES[key](r) for r in runs) if v is not None]
def median(runs, key):
    v = values(runs, key)
    return statistics.median(v) if v else None
def cell(runs, key):
    v = values(runs, key)
    if not v:
        return "–"
    m = f"{statistics.median(v):g}"
    return m if len(v) < 2 else f"{m} ({min(v):g}–{max(v):g})"
def ratio(a, b):
    return f"{a / b:.2f}" if a and b else "–"
print("| scenario | server | runs | CPU µs/frame | ×floor | POST→frame p99 ms | ×floor | admin POST p99 ms | server's own admin POST p99 ≤ ms | RSS/socket idle B | RSS/socket after burst B | lost |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for (scenario, server), runs in groups.items():
    floor = groups.get((scenario, "floor"), [])
    lost = sum(r.get("lost") or 0 for r in runs)
    print(f"| {scenario} | {server} | {len(runs)} | {cell(runs, 'cpu')} "
          f"| {ratio(median(runs, 'cpu'), median(floor, 'cpu'))} | {cell(runs, 'p99')} "
          f"| {ratio(median(runs, 'p99'), median(floor, 'p99'))} | {cell(runs, 'post')} | {cell(runs, 'srvpost')} "
          f"| {cell(runs, 'idle')} | {cell(runs, 'after')} | {lost} |")
EOF
fi

# wait_port: lib.sh (checked on its own, so not followed here).
# shellcheck disable=SC1091
. "$(dirname "$0")/lib.sh"

# binary_of NAME: the program a server name runs.
binary_of() {
    case "$1" in
        *=*) echo "${1#*=}" ;;
        floor) echo "$BENCH" ;;
        new) echo "$NEW" ;;
        old) echo "$OLD" ;;
        aphlict) echo "$APHLICT" ;;
        *) echo "unknown server $1 (floor, new, old, aphlict, or name=/path/to/gorge-notification)" >&2; return 1 ;;
    esac
}

# start_server NAME: starts the floor, a gorge-notification build or Aphlict; sets PID.
start_server() {
    bin=$(binary_of "$1")
    [ -n "$bin" ] || { echo "server $1 has no program (set NEW, OLD or APHLICT)" >&2; return 1; }
    case "$1" in
        floor)
            "$bin" floor --client 127.0.0.1:"$CLIENT_PORT" --admin 127.0.0.1:"$ADMIN_PORT" \
                --timeout 150 >/dev/null &
            ;;
        aphlict)
            config=$(mktemp)
            printf '{"servers":[{"type":"client","port":%s,"listen":"127.0.0.1"},{"type":"admin","port":%s,"listen":"127.0.0.1"}],"logs":[],"cluster":[],"pidfile":"%s.pid"}\n' \
                "$CLIENT_PORT" "$ADMIN_PORT" "$config" >"$config"
            node "$bin" --config="$config" >/dev/null &
            ;;
        *)
            env GORGE_NOTIFICATION_LISTEN_ADDR=127.0.0.1 GORGE_NOTIFICATION_CLIENT_PORT="$CLIENT_PORT" \
                GORGE_NOTIFICATION_ADMIN_PORT="$ADMIN_PORT" GORGE_LOG_LEVEL=warn \
                ${PRELOAD:+LD_PRELOAD=$PRELOAD} \
                "$bin" >/dev/null &
            ;;
    esac
    PID=$!
    wait_port "$ADMIN_PORT"
}

stop_server() {
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    if [ -n "${config:-}" ]; then rm -f "$config" "$config.pid"; config=; fi
}

# scenario NAME SERVER ARGS...: one notify run against a fresh server.
scenario() {
    name=$1 server=$2
    shift 2
    start_server "$server"
    line=$("$BENCH" notify --client ws://127.0.0.1:"$CLIENT_PORT"/ --admin http://127.0.0.1:"$ADMIN_PORT"/ \
        --pid "$PID" --timeout 120 "$@" || true)
    stop_server
    echo "$line" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
r.update(scenario=sys.argv[1], server=sys.argv[2], binary=sys.argv[3], round=int(sys.argv[4]))
print(json.dumps(r))' \
        "$name" "${server%%=*}${PRELOAD:+ ($(basename "$PRELOAD"))}" "$(binary_of "$server")" "$round" >>"$OUT"
    echo "round $round: $name ${server%%=*} done" >&2
}

wants() { case " ${SCENARIOS:-burst live batched stuck} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

servers=${SERVERS:-floor new${OLD:+ old}${APHLICT:+ aphlict}}
for round in $(seq 1 "$ROUNDS"); do
    for server in $servers; do
        # One 64 KiB message at a time to every socket: CPU per frame, latency, RSS after.
        if wants burst; then
            scenario "burst64k-$SOCKETS" "$server" --sockets "$SOCKETS" --messages 10 --rate 2 \
                --fanout all --payload-bytes 65536
        fi
        # Small messages to many live sockets, one at a time: the admin POST must not scale
        # with them.
        if wants live; then
            for live in $LIVE; do
                scenario "live-$live" "$server" --sockets "$live" --messages 100 --rate 10 --fanout all
            done
        fi
        # 100 msg/s to 5 000 sockets: messages overlap, so frames can share writes.
        if wants batched; then
            scenario "batched-5000" "$server" --sockets 5000 --messages 200 --rate 100 \
                --fanout all --settle-ms 30000
        fi
        # 500 subscribers that never read (the floor has no queue to bound them).
        if wants stuck && [ "$server" != floor ]; then
            scenario "stuck-500" "$server" --sockets 100 --stuck 500 --messages 600 --rate 100 \
                --payload-bytes 4096
        fi
    done
done
