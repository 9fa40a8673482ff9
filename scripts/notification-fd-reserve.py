#!/usr/bin/env python3
# Admin POST latency with the descriptor table full of idle client connections (issue 21
# item 7). Starts target/release/gorge-notification with RLIMIT_NOFILE 2048 on two free
# loopback ports, times 20 POSTs idle, opens 3 000 idle TCP connections to the client port
# (no byte sent; the server keeps what its reserve allows and closes the rest,
# client_connections_closed{fd_reserve}), then times 50 POSTs, one every 100 ms, each on a
# new connection as PHP makes them. Prints one JSON line.
#   python3 scripts/notification-fd-reserve.py
import http.client, json, os, resource, socket, subprocess, time

def free_ports(n):
    # All bound at once, so the kernel cannot hand the same port out twice.
    held = [socket.socket() for _ in range(n)]
    for s in held:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in held]
    for s in held:
        s.close()
    return ports

client_port, admin_port = free_ports(2)
env = dict(os.environ, GORGE_NOTIFICATION_LISTEN_ADDR="127.0.0.1",
           GORGE_NOTIFICATION_CLIENT_PORT=str(client_port),
           GORGE_NOTIFICATION_ADMIN_PORT=str(admin_port), GORGE_LOG_LEVEL="warn")
server = subprocess.Popen(["target/release/gorge-notification"], env=env,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (2048, 2048)))
resource.setrlimit(resource.RLIMIT_NOFILE, (8000, 8000))

def post():
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=5)
    conn.request("POST", "/", body=json.dumps({"key": 1, "type": "notification", "subscribers": ["PHID-X"]}))
    response = conn.getresponse(); response.read(); conn.close()
    return (time.perf_counter() - started) * 1000, response.status

def metric(name):
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=5)
    conn.request("GET", "/metrics"); text = conn.getresponse().read().decode(); conn.close()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line.startswith(name)}

try:
    for _ in range(100):
        try:
            post(); break
        except OSError:
            time.sleep(0.1)
    idle = sorted(post()[0] for _ in range(20))
    held, errors = [], 0
    for _ in range(3000):
        try:
            held.append(socket.create_connection(("127.0.0.1", client_port), timeout=2))
        except OSError:
            errors += 1
    time.sleep(0.5)
    latencies, statuses, timeouts = [], set(), 0
    for _ in range(50):
        try:
            ms, status = post(); latencies.append(ms); statuses.add(status)
        except OSError:
            timeouts += 1
        time.sleep(0.1)
    open_fds = len(os.listdir(f"/proc/{server.pid}/fd"))
    latencies.sort()
    print(json.dumps({
        "idle_p99_ms": round(idle[-1], 2), "connections_opened": len(held), "connect_errors": errors,
        "server_fds": open_fds, "closed": metric("gorge_notification_client_connections_closed_total"),
        "posts": len(latencies), "timeouts": timeouts, "statuses": sorted(statuses),
        "p50_ms": round(latencies[len(latencies) // 2], 2) if latencies else None,
        "p99_ms": round(latencies[max(0, int(len(latencies) * 0.99) - 1)], 2) if latencies else None,
        "max_ms": round(latencies[-1], 2) if latencies else None}))
finally:
    server.kill(); server.wait()
