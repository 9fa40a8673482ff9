#!/bin/bash
# Runs the same notify scenarios against the floor (`gorge-bench floor`), this build of
# gorge-notification and optionally a previous build, one after the other, and appends each
# JSON summary (plus "server" and "scenario") to $OUT. Print the table with
#   bins/gorge-bench/floor_compare.sh table
#
#   NEW=target/release/gorge-notification OLD=/path/to/old/gorge-notification \
#   BENCH=target/release/gorge-bench SOCKETS=2000 bins/gorge-bench/floor_compare.sh
#
# SERVERS="new" limits the servers, BURST_ONLY=1 runs only the 64 KiB burst, PRELOAD=path
# runs gorge under another allocator (LD_PRELOAD). Loopback only; every run ends within its
# --timeout.
set -eu

BENCH=${BENCH:-target/release/gorge-bench}
NEW=${NEW:-target/release/gorge-notification}
OLD=${OLD:-}
OUT=${OUT:-/tmp/gorge-floor-compare.jsonl}
SOCKETS=${SOCKETS:-2000}
LIVE=${LIVE:-5000}
CLIENT_PORT=${CLIENT_PORT:-22380}
ADMIN_PORT=${ADMIN_PORT:-22381}
PRELOAD=${PRELOAD:-}

if [ "${1:-}" = table ]; then
    exec python3 - "$OUT" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def g(r, *path):
    for p in path:
        r = (r or {}).get(p) if isinstance(r, dict) else None
    return r
floor = {r["scenario"]: r for r in rows if r["server"] == "floor"}
print("| scenario | server | CPU µs/frame | ×floor | POST→frame p99 ms | ×floor | admin POST p99 ms | RSS/socket idle B | RSS/socket after burst B | lost |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    f = floor.get(r["scenario"], {})
    cpu, fcpu = r.get("server_cpu_us_per_frame"), f.get("server_cpu_us_per_frame")
    p99, fp99 = g(r, "post_to_frame_ms", "p99_ms"), g(f, "post_to_frame_ms", "p99_ms")
    ratio = lambda a, b: f"{a / b:.2f}" if a and b else "–"
    print(f"| {r['scenario']} | {r['server']} | {cpu} | {ratio(cpu, fcpu)} | {p99} | {ratio(p99, fp99)} "
          f"| {g(r, 'admin_post_ms', 'p99_ms')} | {r.get('server_rss_per_socket_bytes')} "
          f"| {r.get('server_rss_per_socket_end_bytes')} | {r.get('lost')} |")
EOF
fi

wait_port() {
    for _ in $(seq 1 100); do
        if (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "port $1 never opened" >&2
    return 1
}

# start_server NAME: starts the floor or a gorge-notification build; sets PID.
start_server() {
    case "$1" in
        floor)
            "$BENCH" floor --client 127.0.0.1:"$CLIENT_PORT" --admin 127.0.0.1:"$ADMIN_PORT" \
                --timeout 90 >/dev/null &
            ;;
        *)
            bin=$NEW
            [ "$1" = previous ] && bin=$OLD
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
}

# scenario NAME SERVER ARGS...: one notify run against a fresh server.
scenario() {
    name=$1 server=$2
    shift 2
    start_server "$server"
    line=$("$BENCH" notify --client ws://127.0.0.1:"$CLIENT_PORT"/ --admin http://127.0.0.1:"$ADMIN_PORT"/ \
        --pid "$PID" --timeout 60 "$@" || true)
    stop_server
    echo "$line" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r["scenario"]=sys.argv[1]; r["server"]=sys.argv[2]; print(json.dumps(r))' \
        "$name" "$server${PRELOAD:+ ($(basename "$PRELOAD"))}" >>"$OUT"
    echo "$name $server done" >&2
}

servers=${SERVERS:-floor new${OLD:+ previous}}
for server in $servers; do
    # One 64 KiB message at a time to every socket: CPU per frame, latency, RSS after.
    scenario "burst64k-$SOCKETS" "$server" --sockets "$SOCKETS" --messages 10 --rate 2 \
        --fanout all --payload-bytes 65536
    [ -n "${BURST_ONLY:-}" ] && continue
    # Many small messages to many live sockets: the admin POST must not scale with them.
    scenario "live-$LIVE" "$server" --sockets "$LIVE" --messages 100 --rate 10 --fanout all
done
[ -n "${BURST_ONLY:-}" ] && exit 0
for server in $servers; do
    [ "$server" = floor ] && continue
    # 500 subscribers that never read (the floor has no queue to bound them).
    scenario "stuck-500" "$server" --sockets 100 --stuck 500 --messages 600 --rate 100 \
        --payload-bytes 4096
done
