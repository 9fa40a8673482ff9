#!/bin/bash
# TLS cost side by side with Aphlict (issue 29 item 6): gorge-notification and Aphlict, each
# over plain ws:// and over wss:// with the same certificate files, on fresh processes, the
# servers and transports interleaved within each round. Appends one JSON line per run (the
# bench's summary plus "server", "transport", "scenario", "round") to $OUT; print the table
# (medians over rounds, ranges in brackets, TLS ÷ plain of the same server) with
#   OUT=... bins/gorge-bench/tls_compare.sh table
#
#   NEW=target/release/gorge-notification BENCH=target/release/gorge-bench \
#   APHLICT=/path/to/phorge/support/aphlict/server/aphlict_server.js \
#   SOCKETS=10000 ROUNDS=2 bins/gorge-bench/tls_compare.sh
#
# Scenarios: `idle-N` — N reading sockets opened (RSS per idle socket), then 100 small
# messages at 10/s to all of them (CPU per delivered frame, POST→frame; up to 30 s for
# stragglers, so a server that falls behind is measured whole); `handshakes` —
# $CONCURRENCY connections opened at once for $HS_SECONDS s, each TCP + TLS (full handshake) +
# WebSocket upgrade + close (server CPU per connection, connections per server-CPU-second).
# Certificates: a root, an intermediate and a leaf for localhost/127.0.0.1 made here with
# openssl (ECDSA P-256 as certbot writes by default; KEY=rsa for RSA 2048); the servers get
# the leaf, its key and the intermediate as the chain, the bench trusts the root only.
# gorge: GORGE_NOTIFICATION_CLIENT_TLS_{CERT,KEY,CHAIN}_FILE; Aphlict: ssl.cert, ssl.key,
# ssl.chain on its client server entry (started as bin/aphlict starts it, with
# --max-old-space-size=256). The admin port stays plain http for both. SERVERS limits the
# servers (gorge aphlict), TRANSPORTS the transports (plain tls), SCENARIOS the scenarios
# (idle handshakes). APHLICT is Phorge's own aphlict_server.js with its `ws` module
# installed beside it (this script does not fetch or install it). Loopback only; every run
# ends within its --timeout.
set -eu

BENCH=${BENCH:-target/release/gorge-bench}
NEW=${NEW:-target/release/gorge-notification}
APHLICT=${APHLICT:-}
OUT=${OUT:-/tmp/gorge-tls-compare.jsonl}
SOCKETS=${SOCKETS:-10000}
ROUNDS=${ROUNDS:-1}
SECONDS_HS=${HS_SECONDS:-10}
CONCURRENCY=${CONCURRENCY:-32}
KEY=${KEY:-ec}
CLIENT_PORT=${CLIENT_PORT:-22480}
ADMIN_PORT=${ADMIN_PORT:-22481}

if [ "${1:-}" = table ]; then
    exec python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def g(r, *path):
    for p in path:
        r = r.get(p) if isinstance(r, dict) else None
    return r
FIGURES = {
    "idle": lambda r: g(r, "server_rss_per_socket_bytes"),
    "cpu": lambda r: g(r, "server_cpu_us_per_frame"),
    "p99": lambda r: g(r, "post_to_frame_ms", "p99_ms"),
    "hs_cpu": lambda r: g(r, "server_handshakes_per_cpu_s"),
    "hs_us": lambda r: g(r, "server_cpu_us_per_handshake"),
    "hs_wall": lambda r: g(r, "per_s"),
    "busy": lambda r: g(r, "server_cores_busy"),
}
groups = {}
for r in rows:
    groups.setdefault((r["scenario"], r["server"], r["transport"]), []).append(r)
def values(runs, key):
    return [v for v in (FIGURES[key](r) for r in runs) if v is not None]
def median(runs, key):
    v = values(runs, key)
    return statistics.median(v) if v else None
def num(x):
    # Thousands grouped with a space as the other tables do; three significant digits below.
    return f"{x:,.0f}".replace(",", " ") if abs(x) >= 100 else f"{x:.3g}"
def cell(runs, key):
    v = values(runs, key)
    if not v:
        return "–"
    m = num(statistics.median(v))
    return m if len(v) < 2 else f"{m} ({num(min(v))}–{num(max(v))})"
def ratio(a, b):
    return f"{a / b:.2f}" if a and b else "–"
def suite(runs):
    t = next((g(r, "client_tls") for r in runs if g(r, "client_tls")), None)
    return f"{t['version']} {t['suite']}" if t else "plain"
idle = [k for k in groups if k[0].startswith("idle")]
if idle:
    print("| scenario | server | transport | runs | RSS/idle socket B | ×plain | CPU µs/frame | ×plain | POST→frame p99 ms | lost | sockets failed | TLS |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (scenario, server, transport) in sorted(idle):
        runs = groups[(scenario, server, transport)]
        plain = groups.get((scenario, server, "plain"), [])
        lost = sum(r.get("lost") or 0 for r in runs)
        failed = sum(r.get("sockets_failed") or 0 for r in runs)
        print(f"| {scenario} | {server} | {transport} | {len(runs)} | {cell(runs, 'idle')} "
              f"| {ratio(median(runs, 'idle'), median(plain, 'idle'))} | {cell(runs, 'cpu')} "
              f"| {ratio(median(runs, 'cpu'), median(plain, 'cpu'))} | {cell(runs, 'p99')} "
              f"| {lost} | {failed} | {suite(runs)} |")
    print()
hs = [k for k in groups if k[0] == "handshakes"]
if hs:
    print("| server | transport | runs | connections per server CPU-second | server CPU µs per connection | connections/s (wall) | server cores busy | failed | TLS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(hs):
        runs = groups[key]
        failed = sum(r.get("failed") or 0 for r in runs)
        print(f"| {key[1]} | {key[2]} | {len(runs)} | {cell(runs, 'hs_cpu')} | {cell(runs, 'hs_us')} "
              f"| {cell(runs, 'hs_wall')} | {cell(runs, 'busy')} | {failed} | {suite(runs)} |")
EOF
fi

CERTS=$(mktemp -d /tmp/gorge-tls-compare.XXXXXX)
trap 'rm -rf "$CERTS"' EXIT

# make_certs DIR: root → intermediate → leaf (localhost, 127.0.0.1), as an operator's CA does.
make_certs() {
    local d=$1 newkey
    case "$KEY" in
        ec) newkey=(-newkey ec -pkeyopt ec_paramgen_curve:P-256) ;;
        rsa) newkey=(-newkey rsa:2048) ;;
        *) echo "KEY must be ec or rsa" >&2; return 1 ;;
    esac
    openssl req -x509 -nodes "${newkey[@]}" -keyout "$d/root.key" -out "$d/root.pem" -days 30 \
        -subj "/CN=gorge-bench TLS root" -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -nodes "${newkey[@]}" -keyout "$d/inter.key" -out "$d/inter.csr" \
        -subj "/CN=gorge-bench TLS intermediate" 2>/dev/null
    printf 'basicConstraints=critical,CA:TRUE,pathlen:0\nkeyUsage=critical,keyCertSign,cRLSign\n' >"$d/inter.ext"
    openssl x509 -req -in "$d/inter.csr" -CA "$d/root.pem" -CAkey "$d/root.key" -CAcreateserial \
        -days 30 -extfile "$d/inter.ext" -out "$d/chain.pem" 2>/dev/null
    openssl req -nodes "${newkey[@]}" -keyout "$d/leaf.key" -out "$d/leaf.csr" \
        -subj "/CN=localhost" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$d/leaf.ext"
    openssl x509 -req -in "$d/leaf.csr" -CA "$d/chain.pem" -CAkey "$d/inter.key" -CAcreateserial \
        -days 30 -extfile "$d/leaf.ext" -out "$d/leaf.pem" 2>/dev/null
}
make_certs "$CERTS"

# wait_port: lib.sh (checked on its own, so not followed here).
# shellcheck disable=SC1091
. "$(dirname "$0")/lib.sh"

# start_server SERVER TRANSPORT: a fresh gorge-notification or Aphlict; sets PID.
start_server() {
    local ssl="" tls_env=()
    if [ "$2" = tls ]; then
        ssl=$(printf ',"ssl.key":"%s","ssl.cert":"%s","ssl.chain":"%s"' \
            "$CERTS/leaf.key" "$CERTS/leaf.pem" "$CERTS/chain.pem")
        tls_env=(GORGE_NOTIFICATION_CLIENT_TLS_CERT_FILE="$CERTS/leaf.pem"
            GORGE_NOTIFICATION_CLIENT_TLS_KEY_FILE="$CERTS/leaf.key"
            GORGE_NOTIFICATION_CLIENT_TLS_CHAIN_FILE="$CERTS/chain.pem")
    fi
    case "$1" in
        aphlict)
            [ -n "$APHLICT" ] || { echo "set APHLICT to run Aphlict" >&2; return 1; }
            printf '{"servers":[{"type":"client","port":%s,"listen":"127.0.0.1"%s},{"type":"admin","port":%s,"listen":"127.0.0.1"}],"logs":[],"cluster":[],"pidfile":"%s/aphlict.pid"}\n' \
                "$CLIENT_PORT" "$ssl" "$ADMIN_PORT" "$CERTS" >"$CERTS/aphlict.json"
            ( ulimit -n "$(ulimit -Hn)"
              exec node --max-old-space-size=256 "$APHLICT" --config="$CERTS/aphlict.json" >/dev/null ) &
            ;;
        gorge)
            ( ulimit -n "$(ulimit -Hn)"
              exec env GORGE_NOTIFICATION_LISTEN_ADDR=127.0.0.1 GORGE_NOTIFICATION_CLIENT_PORT="$CLIENT_PORT" \
                GORGE_NOTIFICATION_ADMIN_PORT="$ADMIN_PORT" GORGE_LOG_LEVEL=warn "${tls_env[@]}" \
                "$NEW" >/dev/null ) &
            ;;
        *) echo "unknown server $1 (gorge, aphlict)" >&2; return 1 ;;
    esac
    PID=$!
    wait_port "$ADMIN_PORT"
    wait_port "$CLIENT_PORT"
}

stop_server() {
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
}

# record NAME SERVER TRANSPORT LINE: appends the bench's summary with the run's labels.
record() {
    echo "$4" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
r.update(scenario=sys.argv[1], server=sys.argv[2], transport=sys.argv[3], round=int(sys.argv[4]), key=sys.argv[5])
print(json.dumps(r))' "$1" "$2" "$3" "$round" "$KEY" >>"$OUT"
    echo "round $round: $1 $2 $3: $(echo "$4" | cut -c1-200)" >&2
}

client_url() { if [ "$1" = tls ]; then echo "wss://127.0.0.1:$CLIENT_PORT/"; else echo "ws://127.0.0.1:$CLIENT_PORT/"; fi; }

wants() { case " $2 " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

for round in $(seq 1 "$ROUNDS"); do
    for server in ${SERVERS:-gorge${APHLICT:+ aphlict}}; do
        for transport in ${TRANSPORTS:-plain tls}; do
            if wants idle "${SCENARIOS:-idle handshakes}"; then
                start_server "$server" "$transport"
                line=$("$BENCH" notify --client "$(client_url "$transport")" --ca-file "$CERTS/root.pem" \
                    --admin "http://127.0.0.1:$ADMIN_PORT/" --pid "$PID" --sockets "$SOCKETS" \
                    --messages 100 --rate 10 --fanout all --settle-ms 30000 --timeout 180 || true)
                stop_server
                record "idle-$SOCKETS" "$server" "$transport" "$line"
            fi
            if wants handshakes "${SCENARIOS:-idle handshakes}"; then
                start_server "$server" "$transport"
                line=$("$BENCH" handshakes --client "$(client_url "$transport")" --ca-file "$CERTS/root.pem" \
                    --admin "http://127.0.0.1:$ADMIN_PORT/" --pid "$PID" --seconds "$SECONDS_HS" \
                    --concurrency "$CONCURRENCY" --timeout $((SECONDS_HS + 40)) || true)
                stop_server
                record handshakes "$server" "$transport" "$line"
            fi
        done
    done
done
