#!/usr/bin/env python3
# MySQL connections held by one gorge-webhook process while a backlog waits on a receiver that
# sleeps 15 s per POST (issue 9 W4 / issue 10 "Measure"). Needs the mysql client, root on
# 127.0.0.1:3306 and a built target/debug/gorge-webhook. Creates and drops its own database
# and user; runs 40 s.
#   python3 scripts/webhook-db-connections.py ROWS MAX_CONCURRENT [ENV=VALUE ...]
import os, random, socket, subprocess, sys, threading, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
ns = "gtm%06x" % random.randrange(1 << 24)
user = ns + "u"
def sql(q, db=None):
    args = ["mysql", "-uroot", "-h127.0.0.1", "-N", "-B"] + ([db] if db else [])
    return subprocess.run(args, input=q, capture_output=True, text=True, check=True).stdout
schema = open("compat/herald-schema.sql").read().replace("{$NAMESPACE}", ns)
sql(schema)
sql(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'; GRANT SELECT, UPDATE ON `{ns}_herald`.* TO '{user}'@'%';")
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0)); self.rfile.read(n)
        time.sleep(15)
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
ThreadingHTTPServer.daemon_threads = True
srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
port = srv.server_address[1]
hooks = [f"PHID-HWBH-{ns}{i:04d}" for i in range(100)]
now = int(time.time())
q = ["INSERT INTO herald_webhook (phid,name,webhookURI,viewPolicy,editPolicy,status,hmacKey,dateCreated,dateModified) VALUES " +
     ",".join(f"('{h}','n{i}','http://127.0.0.1:{port}/{i}','users','users','enabled','k',0,0)" for i, h in enumerate(hooks)) + ";"]
rows = []
for r in range(int(sys.argv[1])):
    h = hooks[r % 100]
    rows.append(f"('PHID-HWBR-{ns}{r:06d}','{h}','PHID-TASK-x','queued','{{\"handedOverTo\":\"gorge-webhook\",\"retry\":\"never\"}}','none',0,{now},{now})")
q.append("INSERT INTO herald_webhookrequest (phid,webhookPHID,objectPHID,status,properties,lastRequestResult,lastRequestEpoch,dateCreated,dateModified) VALUES " + ",".join(rows) + ";")
sql("\n".join(q), ns + "_herald")
s = socket.socket(); s.bind(("127.0.0.1", 0)); lport = s.getsockname()[1]; s.close()
env = dict(PATH=os.environ["PATH"], GORGE_WEBHOOK_MYSQL_HOST="127.0.0.1", GORGE_WEBHOOK_MYSQL_PORT="3306",
           GORGE_WEBHOOK_MYSQL_USER=user, GORGE_WEBHOOK_MYSQL_PASS="pw", GORGE_WEBHOOK_NAMESPACE=ns,
           GORGE_WEBHOOK_OUTBOUND_BLACKLIST="none", GORGE_WEBHOOK_MAX_CONCURRENT=sys.argv[2],
           GORGE_LISTEN_ADDR=f"127.0.0.1:{lport}", GORGE_LOG_LEVEL="warn")
env.update(dict(a.split("=", 1) for a in sys.argv[3:]))
p = subprocess.Popen([os.environ.get("GORGE_WEBHOOK_BIN", "target/debug/gorge-webhook")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
peak = 0; samples = []
t0 = time.time()
try:
    while time.time() - t0 < 40:
        n = int(sql(f"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER='{user}'").strip())
        samples.append(n); peak = max(peak, n)
        time.sleep(0.5)
    sent = sql("SELECT COUNT(*) FROM herald_webhookrequest WHERE status='sent'", ns + "_herald").strip()
    print(f"rows={sys.argv[1]} max_concurrent={sys.argv[2]} extra={sys.argv[3:]} peak_connections={peak} sent_after_40s={sent} samples={samples[::8]}")
finally:
    p.terminate()
    try: p.wait(30)
    except Exception: p.kill()
    sql(f"DROP DATABASE `{ns}_herald`; DROP USER '{user}'@'%';")
