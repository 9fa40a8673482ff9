#!/usr/bin/env python3
"""Builds both service images from deploy/docker/Dockerfile on a machine without a container
daemon, as .ci/run does, and checks each one against the release matrix and by running it.

For every entry of the release matrix (`scripts/check-release-matrix.sh --matrix`, so the
services, health ports and image names come from .github/workflows/release.yml alone):

1. build `localhost/<image name>:ci` with `buildah bud --isolation chroot`, from the one
   Dockerfile, with `BINARIES=prebuilt`: the runtime stage wraps the binary this checkout has
   already built and tested (`target/debug/<service>`, debug info stripped), on a base made by
   `mmdebstrap --variant=minbase bookworm` (a `debian:bookworm-slim` equivalent, cached, below);
2. check its configuration: the matrix port exposed (and only it), a numeric non-root user,
   the entrypoint, the HEALTHCHECK running the binary's own `healthcheck`, SIGTERM as the stop
   signal, the OCI title and licence labels (the licence from Cargo.toml);
3. run it with `buildah run --isolation chroot` as the image's user (host network, loopback
   ports only): `--version` through the entrypoint names the service; the HEALTHCHECK command
   fails while nothing listens and answers 0 once the service runs; the service does its job
   through the image (gorge-notification: a message posted to the admin port arrives on a
   WebSocket subscribed on the client port, and /status/ counts it; gorge-webhook: a
   handed-over row of a Phorge-schema database built from compat/herald-schema.sql on the
   MariaDB at 127.0.0.1:3306 is delivered, signed, to a receiver on loopback and written
   `sent`); then SIGTERM stops it with exit code 0 within the stop bound the binary states in
   `--check-config` (its derived fact `stop_within_sec`).

The base image is `localhost/gorge-ci-base:bookworm` in buildah's storage
(/var/lib/containers/storage, as root). It is made again when it is missing, when its recipe
(BASE_RECIPE below) changed, when it is older than BASE_MAX_AGE_DAYS (security updates), or
when it cannot run a command (a damaged store). `buildah bud --layers` caches the Dockerfile's
steps on top of it, so a warm run only copies the new binaries; layers no image uses any more
are removed after each build.

Usage: scripts/check-images.py [--bin-dir DIR]   (default: cargo's target directory + /debug)
Needs: root, buildah and mmdebstrap (Debian packages), binutils' strip, python3 with PyYAML,
the `mariadb` client and MariaDB at 127.0.0.1:3306 (root, empty password).
"""

import argparse
import base64
import calendar
import hashlib
import hmac
import http.server
import json
import os
import pathlib
import queue
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy/docker/Dockerfile"
BASE_TAG = "localhost/gorge-ci-base:bookworm"
BASE_MAX_AGE_DAYS = 7
RECIPE_LABEL = "gorge.ci.base-recipe"
# The base: Debian's minimal bootstrap with what debian:bookworm-slim leaves out or sets
# (docs, man pages and locales excluded from every package; apt caches and package lists not
# kept; dpkg without fsync) and merged /usr, from the same three suites the official image
# lists. Any change here rebuilds the cached base.
BASE_SUITES = [
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
]
CLEAN_APT = ('"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb '
             '/var/cache/apt/*.bin || true";')
BASE_RECIPE = [
    "--variant=minbase",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=force-unsafe-io",
    '--aptopt=Dir::Cache::pkgcache ""',
    '--aptopt=Dir::Cache::srcpkgcache ""',
    f"--aptopt=DPkg::Post-Invoke {{ {CLEAN_APT} }}",
    f"--aptopt=APT::Update::Post-Invoke {{ {CLEAN_APT} }}",
    '--aptopt=Acquire::Languages "none"',
    "bookworm",
]
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the image promises, beside what the matrix says.
ENTRYPOINT = ["/usr/local/bin/gorge-service"]
HEALTHCHECK = ["CMD", "/usr/local/bin/gorge-service", "healthcheck"]
# Generous: the machine is shared and buildah run adds a second or two per command.
START_PATIENCE = 60.0
JOB_PATIENCE = 30.0
# How long SIGTERM is given when the binary states no stop bound (that alone fails the check).
UNSTATED_PATIENCE = 60.0
# The name buildah gives a working container it makes itself during a build.
BUILD_LEFTOVER = re.compile(r"^[0-9a-f]{12}-working-container(-[0-9]+)?$")
HANDOVER_MARKER = ("handedOverTo", "gorge-webhook")  # crates/gorge-claim/src/handover.rs

failures = []


def say(text):
    print(f"--> {text}", flush=True)


def fail(text):
    print(f"check-images: FAIL: {text}", file=sys.stderr, flush=True)
    failures.append(text)


def run(cmd, check=True, **kwargs):
    """Runs `cmd` (no input); its output as text. Raises with the output when it fails and
    `check`."""
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kwargs)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return proc


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inspect_image(ref):
    """`buildah inspect` of an image, or None when there is none (or it cannot be read)."""
    proc = run(["buildah", "inspect", "--type", "image", ref], check=False)
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        return None


class Container:
    """A buildah working container of an image, named `gorge-ci-…-<pid of this script>`;
    removed by `close()`, or by a later run if this one was killed ([`remove_orphans`])."""

    def __init__(self, image, name):
        run(["buildah", "rm", name], check=False)
        self.name = run(["buildah", "from", "--pull-never", "--name", name, image]).stdout.strip()

    def command(self, argv, env):
        flags = [f"--env={k}={v}" for k, v in env.items()]
        return ["buildah", "run", "--isolation", "chroot", *flags, self.name, "--", *argv]

    def run(self, argv, env=None, timeout=60):
        return run(self.command(argv, env or {}), check=False, timeout=timeout)

    def close(self):
        run(["buildah", "rm", self.name], check=False)


def buildah_containers():
    """`buildah containers` as a list (buildah prints `null` for none)."""
    return json.loads(run(["buildah", "containers", "--json"]).stdout or "null") or []


def remove_orphans():
    """Removes the working containers of runs of this script that are gone (killed)."""
    for container in buildah_containers():
        match = re.match(r"^gorge-ci-.*-([0-9]+)$", container.get("containername", ""))
        if match and not pathlib.Path(f"/proc/{match.group(1)}").exists():
            run(["buildah", "rm", container["id"]], check=False)


# --- the base image ---------------------------------------------------------------------

def recipe_hash():
    return hashlib.sha256(json.dumps([BASE_RECIPE, BASE_SUITES]).encode()).hexdigest()[:16]


def base_is_stale():
    """Why the cached base must be made again, or None when it can be used."""
    info = inspect_image(BASE_TAG)
    if info is None:
        return "absent (or unreadable)"
    config = info.get("Docker", {}).get("config", {})
    if (config.get("Labels") or {}).get(RECIPE_LABEL) != recipe_hash():
        return "made by another recipe"
    created = info.get("Docker", {}).get("created", "")
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", created)
    if not match:
        return f"no creation time ({created!r})"
    age = time.time() - calendar.timegm(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))
    if age > BASE_MAX_AGE_DAYS * 86400:
        return f"older than {BASE_MAX_AGE_DAYS} days"
    try:
        probe = Container(BASE_TAG, f"gorge-ci-base-probe-{os.getpid()}")
    except RuntimeError as err:
        return f"cannot be used: {err}"
    try:
        out = probe.run(["/bin/sh", "-c", "apt-get --version >/dev/null && dpkg --audit"])
        if out.returncode != 0:
            return f"does not run: {out.stdout}{out.stderr}".strip()
    finally:
        probe.close()
    return None


def ensure_base():
    why = base_is_stale()
    if why is None:
        say(f"base {BASE_TAG}: cached")
        return
    say(f"base {BASE_TAG}: {why}; making it with mmdebstrap (about a minute on an idle machine)")
    run(["buildah", "rmi", "--force", BASE_TAG], check=False)
    with tempfile.TemporaryDirectory(prefix="gorge-ci-base-") as tmp:
        tar = pathlib.Path(tmp) / "rootfs.tar"
        run(["mmdebstrap", "--quiet", "--format=tar", *BASE_RECIPE, str(tar), *BASE_SUITES])
        name = f"gorge-ci-base-make-{os.getpid()}"
        run(["buildah", "rm", name], check=False)
        ctr = run(["buildah", "from", "--name", name, "scratch"]).stdout.strip()
        try:
            run(["buildah", "add", "--quiet", ctr, str(tar), "/"])
            run(["buildah", "config", f"--env=PATH={BASE_PATH}", "--cmd=bash",
                 f"--label={RECIPE_LABEL}={recipe_hash()}", ctr])
            run(["buildah", "commit", "--quiet", "--format", "docker", ctr, BASE_TAG])
        finally:
            run(["buildah", "rm", ctr], check=False)
    why = base_is_stale()
    if why is not None:
        raise RuntimeError(f"the base just made is not usable: {why}")


def prune_unused_layers():
    """Removes the unnamed images whose top layer no named image is built on: the cached steps
    of builds whose binaries were replaced since, and replaced bases. The cached steps under
    the current images stay. Reads the layer graph from buildah's store (containers/storage's
    images.json and layers.json: one `buildah inspect` per image would take half a minute)."""
    store = json.loads(run(["buildah", "info"]).stdout)["store"]
    root, driver = pathlib.Path(store["GraphRoot"]), store["GraphDriverName"]
    try:
        images = json.loads((root / f"{driver}-images/images.json").read_text())
        parents = {layer["id"]: layer.get("parent") for layer in
                   json.loads((root / f"{driver}-layers/layers.json").read_text())}
    except (OSError, ValueError, KeyError, TypeError) as err:
        say(f"not pruning old image layers: cannot read buildah's store ({err})")
        return
    used = set()
    for image in images:
        layer = image.get("layer") if image.get("names") else None
        while layer and layer not in used:
            used.add(layer)
            layer = parents.get(layer)
    stale = [i["id"] for i in images if not i.get("names") and i.get("layer") not in used]
    # buildah bud (1.28) leaves a working container behind for a stage whose FROM names an
    # earlier stage (`FROM ${BINARIES} AS binaries`); they hold those images.
    leftovers = [c["id"] for c in buildah_containers()
                 if c.get("builder") and c.get("imageid") in stale
                 and BUILD_LEFTOVER.match(c.get("containername", ""))]
    if leftovers:
        run(["buildah", "rm", *leftovers], check=False)
    if stale:
        run(["buildah", "rmi", *stale], check=False)


# --- build and configuration -------------------------------------------------------------

def build(service, port, binary, tag):
    with tempfile.TemporaryDirectory(prefix=f"gorge-ci-{service}-") as context:
        # The context holds only the binary (the Dockerfile's prebuilt stage copies it).
        run(["strip", "--strip-debug", "-o", str(pathlib.Path(context) / service), str(binary)])
        run(["buildah", "bud", "--quiet", "--isolation", "chroot", "--format", "docker",
             "--layers", "--pull-never", "-f", str(DOCKERFILE),
             "--build-arg", "BINARIES=prebuilt",
             "--build-arg", f"SERVICE={service}",
             "--build-arg", f"PORT={port}",
             "--build-arg", f"RUNTIME_IMAGE={BASE_TAG}",
             "-t", tag, context])


def check_config(service, port, tag, license_):
    info = inspect_image(tag)
    if info is None:
        fail(f"{tag}: cannot inspect the image just built")
        return None
    config = info.get("Docker", {}).get("config", {})
    want = {
        "exposed ports": ({f"{port}/tcp": {}}, config.get("ExposedPorts")),
        "entrypoint": (ENTRYPOINT, config.get("Entrypoint")),
        "HEALTHCHECK": (HEALTHCHECK, (config.get("Healthcheck") or {}).get("Test")),
        "stop signal": ("SIGTERM", config.get("StopSignal")),
        "label org.opencontainers.image.title": (
            service, (config.get("Labels") or {}).get("org.opencontainers.image.title")),
        "label org.opencontainers.image.licenses": (
            license_, (config.get("Labels") or {}).get("org.opencontainers.image.licenses")),
    }
    for what, (expected, found) in want.items():
        if expected != found:
            fail(f"{tag}: {what} is {found!r}, expected {expected!r} (release matrix: {service} "
                 f"health port {port})")
    user = str(config.get("User") or "")
    uid = user.split(":")[0]
    if not uid.isdigit() or int(uid) == 0:
        fail(f"{tag}: user {user!r} must be a numeric non-root uid (Kubernetes runAsNonRoot "
             f"can only verify a number)")
    env = dict(e.split("=", 1) for e in config.get("Env") or [])
    if env.get("GORGE_SERVICE") != service:
        fail(f"{tag}: GORGE_SERVICE is {env.get('GORGE_SERVICE')!r}, expected {service!r}")
    return config


# --- running the image --------------------------------------------------------------------

def stop_bound(container, argv, env):
    """The most seconds the service may take to exit after SIGTERM, as the binary states it in
    `--check-config` with this environment: its derived fact `stop_within_sec = N`."""
    out = container.run(argv + ["--check-config"], env)
    text = out.stdout + out.stderr
    match = re.search(r"^stop_within_sec\s*=\s*(\d+)\b", text, re.MULTILINE)
    if out.returncode != 0 or not match:
        raise RuntimeError(f"{' '.join(argv)} --check-config (exit {out.returncode}) does not "
                           f"state its stop bound (\"stop_within_sec = N\"):\n"
                           f"{text[-2000:]}")
    return int(match.group(1))


class Service:
    """The image's entrypoint running in a working container, as the image's user."""

    def __init__(self, container, argv, env, log_dir, name):
        self.log = pathlib.Path(log_dir) / f"{name}.log"
        self.handle = open(self.log, "wb")
        self.proc = subprocess.Popen(container.command(argv, env), stdin=subprocess.DEVNULL,
                                     stdout=self.handle, stderr=subprocess.STDOUT)

    def pid(self):
        """The service process: the descendant of `buildah run` that runs the entrypoint."""
        deadline = time.monotonic() + START_PATIENCE
        while time.monotonic() < deadline and self.proc.poll() is None:
            for pid in descendants(self.proc.pid):
                if read_proc(pid, "comm").strip() == os.path.basename(ENTRYPOINT[0]):
                    return pid
            time.sleep(0.1)
        raise RuntimeError(f"no {ENTRYPOINT[0]} process under buildah run:\n{self.output()}")

    def output(self):
        self.handle.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            for pid in descendants(self.proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.kill()
        self.proc.wait()
        self.handle.close()


def read_proc(pid, name):
    try:
        return pathlib.Path(f"/proc/{pid}/{name}").read_text()
    except OSError:
        return ""


def descendants(root):
    children = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = read_proc(entry.name, "stat")
            if stat:
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def wait_healthy(container, healthcheck, env, service):
    deadline = time.monotonic() + START_PATIENCE
    while True:
        out = container.run(healthcheck, env)
        if out.returncode == 0:
            return
        if service.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"HEALTHCHECK {healthcheck} never answered 0 (last: exit "
                               f"{out.returncode}: {out.stderr.strip()}); service output:\n"
                               f"{service.output()}")
        time.sleep(0.5)


def sigterm(service, bound, during=None):
    """SIGTERM to the service process; it must exit 0 within `bound` seconds (None: the
    binary states no bound; wait UNSTATED_PATIENCE and report). `during` runs while it stops
    (it may check what a client sees). Returns the seconds it took and the process's uid."""
    pid = service.pid()
    uid = re.search(r"^Uid:\s+(\d+)", read_proc(pid, "status"), re.MULTILINE)
    started = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    if during:
        during(bound or UNSTATED_PATIENCE)
    try:
        code = service.proc.wait(timeout=(bound or UNSTATED_PATIENCE) + 5)
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - started
    if code != 0 or (bound is not None and took > bound):
        promise = f"within {bound} s" if bound is not None else "(no bound stated)"
        raise RuntimeError(f"after SIGTERM: exit {code} after {took:.1f} s; expected exit 0 "
                           f"{promise}. Output:\n{service.output()}")
    return took, uid.group(1) if uid else "?"


class WebSocket:
    """Just enough of a WebSocket client (RFC 6455) for one subscription."""

    def __init__(self, port, path="/"):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=JOB_PATIENCE)
        key = base64.b64encode(secrets.token_bytes(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                           f"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise RuntimeError(f"WebSocket upgrade: connection closed after {head!r}")
            head += chunk
        head, self.buffer = head.split(b"\r\n\r\n", 1)
        accept = base64.b64encode(hashlib.sha1(
            (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        if not head.startswith(b"HTTP/1.1 101") or accept.encode() not in head:
            raise RuntimeError(f"WebSocket upgrade refused: {head!r}")

    def send(self, value):
        payload = json.dumps(value).encode()
        mask = secrets.token_bytes(4)
        header = bytes([0x81])
        if len(payload) < 126:
            header += bytes([0x80 | len(payload)])
        else:
            header += bytes([0x80 | 126]) + struct.pack(">H", len(payload))
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _read(self, n):
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("WebSocket closed by the server")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def receive(self):
        """(opcode, payload) of the next frame."""
        first, second = self._read(2)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack(">H", self._read(2))[0]
        elif length == 127:
            length = struct.unpack(">Q", self._read(8))[0]
        return first & 0x0F, self._read(length)

    def receive_json(self):
        while True:
            opcode, payload = self.receive()
            if opcode == 1:
                return json.loads(payload)
            if opcode == 8:
                raise RuntimeError(f"WebSocket closed: {payload!r}")


def notification_job(ports):
    """A message posted as Phorge posts it reaches a subscribed WebSocket; /status/ counts
    it. Returns the socket, which must see the server's close frame on SIGTERM."""
    phid = f"PHID-USER-imagecheck{secrets.token_hex(6)}"
    ws = WebSocket(ports["client"])
    ws.send({"command": "subscribe", "data": [phid]})
    ws.send({"command": "ping"})
    if ws.receive_json() != {"type": "pong"}:
        raise RuntimeError("no pong after subscribe")
    message = {"key": 4242, "type": "notification", "subscribers": [phid]}
    # PhabricatorNotificationClient posts raw JSON labelled as a form (urllib's default).
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['admin']}/?instance=default",
                                data=json.dumps(message).encode(), timeout=JOB_PATIENCE) as r:
        receipt = json.loads(r.read())
    if "fingerprint" not in receipt:
        raise RuntimeError(f"admin POST answered {receipt!r}")
    frame = ws.receive_json()
    # Aphlict adds the fingerprints of the servers that relayed it.
    if frame != {**message, "touched": [receipt["fingerprint"]]}:
        raise RuntimeError(f"the WebSocket got {frame!r}, expected the posted {message!r} "
                           f"touched by {receipt['fingerprint']}")
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['admin']}/status/",
                                timeout=JOB_PATIENCE) as r:
        status = json.loads(r.read())
    if status.get("clients.active") != 1 or status.get("messages.out", 0) < 1:
        raise RuntimeError(f"/status/ does not count the socket and the message: {status!r}")
    say(f"gorge-notification: the message posted to :{ports['admin']} arrived on the "
        f"WebSocket on :{ports['client']}; /status/ {status}")
    return ws


class Receiver:
    """A webhook receiver on loopback: records each POST, answers 200."""

    def __init__(self):
        self.requests = queue.Queue()
        received = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.put((self.path, dict(self.headers), body))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def mariadb(sql, database=None):
    cmd = ["mariadb", "--host=127.0.0.1", "--port=3306", "--user=root", "--batch",
           "--skip-column-names"]
    if database:
        cmd.append(f"--database={database}")
    proc = subprocess.run(cmd, input=sql, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"mariadb: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


class PhorgeDatabase:
    """`{namespace}_herald` made from compat/herald-schema.sql, with one hook and one row
    handed over as the kit hands it over (the marker appended to `properties`); dropped by
    the step it adds to `teardown`."""

    def __init__(self, receiver_port, teardown):
        self.namespace = f"gimg{secrets.token_hex(6)}"
        self.database = f"{self.namespace}_herald"
        schema = (ROOT / "compat/herald-schema.sql").read_text()
        teardown.append(self.drop)
        mariadb(schema.replace("{$NAMESPACE}", self.namespace))
        self.hmac_key = secrets.token_hex(16)
        self.hook = f"PHID-HWBH-{self.namespace}"
        self.object = f"PHID-TASK-{self.namespace}"
        self.url = f"http://127.0.0.1:{receiver_port}/image-check"
        now = int(time.time())
        properties = {"retry": "forever", "transactionPHIDs": ["PHID-XACT-TASK-aaaaaaaaaaaaaaa"],
                      "triggerPHIDs": ["PHID-HRUL-aaaaaaaaaaaaaaaaaaaa"], "silent": False,
                      "secure": False, "test": False, HANDOVER_MARKER[0]: HANDOVER_MARKER[1]}
        # phutil_json_encode: compact, no escaped slashes.
        encoded = json.dumps(properties, separators=(",", ":"))
        mariadb(f"INSERT INTO herald_webhook (phid, name, webhookURI, viewPolicy, editPolicy, "
                f"status, hmacKey, dateCreated, dateModified) VALUES ('{self.hook}', "
                f"'image check', '{self.url}', 'users', 'users', 'enabled', '{self.hmac_key}', "
                f"{now}, {now});"
                f"INSERT INTO herald_webhookrequest (phid, webhookPHID, objectPHID, status, "
                f"properties, lastRequestResult, lastRequestEpoch, dateCreated, dateModified) "
                f"VALUES ('PHID-HWBR-{self.namespace}', '{self.hook}', '{self.object}', 'queued', "
                f"'{encoded}', 'none', 0, {now}, {now});", self.database)

    def row(self):
        return mariadb("SELECT status, lastRequestResult FROM herald_webhookrequest",
                       self.database).split()

    def drop(self):
        mariadb(f"DROP DATABASE IF EXISTS `{self.database}`")


def webhook_job(receiver, db):
    """The handed-over row reaches the receiver, signed with the hook's key, and is written
    `sent`."""
    try:
        path, headers, body = receiver.requests.get(timeout=JOB_PATIENCE)
    except queue.Empty:
        raise RuntimeError(f"no POST reached the receiver within {JOB_PATIENCE} s; row: "
                           f"{db.row()}") from None
    want = hmac.new(db.hmac_key.encode(), body, hashlib.sha256).hexdigest()
    signature = {k.lower(): v for k, v in headers.items()}.get("x-phabricator-webhook-signature")
    if signature != want:
        raise RuntimeError(f"signature {signature!r}, expected {want!r}")
    payload = json.loads(body)
    if path != "/image-check" or payload.get("object", {}).get("phid") != db.object:
        raise RuntimeError(f"POST {path} with {payload!r}, expected the row's object {db.object}")
    deadline = time.monotonic() + JOB_PATIENCE
    while db.row() != ["sent", "okay"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the row is {db.row()} after the delivery, expected sent/okay")
        time.sleep(0.2)
    say(f"gorge-webhook: the handed-over row of {db.database} reached the receiver, signed, "
        f"and is written sent/okay")


def exercise(service, tag, config, log_dir):
    """Runs the image: --version, HEALTHCHECK before and after start, its job, SIGTERM."""
    entrypoint = config["Entrypoint"]
    healthcheck = config["Healthcheck"]["Test"][1:]
    teardown = []
    server = None
    try:
        if service == "gorge-notification":
            ports = {"client": free_port(), "admin": free_port()}
            env = {"GORGE_NOTIFICATION_CLIENT_PORT": ports["client"],
                   "GORGE_NOTIFICATION_ADMIN_PORT": ports["admin"],
                   "GORGE_NOTIFICATION_CLIENT_LISTEN_ADDR": "127.0.0.1",
                   "GORGE_NOTIFICATION_DRAIN_SECONDS": "2"}
        elif service == "gorge-webhook":
            receiver = Receiver()
            teardown.append(receiver.close)
            db = PhorgeDatabase(receiver.port, teardown)
            env = {"GORGE_WEBHOOK_MYSQL_HOST": "127.0.0.1", "GORGE_WEBHOOK_MYSQL_PORT": "3306",
                   "GORGE_WEBHOOK_MYSQL_USER": "root", "GORGE_WEBHOOK_MYSQL_PASS": "",
                   "GORGE_WEBHOOK_NAMESPACE": db.namespace,
                   # The receiver is on loopback, which the default blacklist refuses.
                   "GORGE_WEBHOOK_OUTBOUND_BLACKLIST": "none",
                   "GORGE_WEBHOOK_POLL_INTERVAL_MS": "200",
                   "GORGE_LISTEN_ADDR": f"127.0.0.1:{free_port()}"}
        else:
            raise RuntimeError(f"{service}: no job known for this service "
                               f"(scripts/check-images.py)")
        env = {k: str(v) for k, v in env.items()}
        env["GORGE_LOG_FORMAT"] = "json"
        runner = Container(tag, f"gorge-ci-{service}-run-{os.getpid()}")
        teardown.append(runner.close)
        probe = Container(tag, f"gorge-ci-{service}-probe-{os.getpid()}")
        teardown.append(probe.close)
        version = runner.run(entrypoint + ["--version"])
        if version.returncode != 0 or not version.stdout.startswith(f"{service} "):
            raise RuntimeError(f"{' '.join(entrypoint)} --version: exit {version.returncode}: "
                               f"{version.stdout}{version.stderr}")
        try:
            bound, unstated = stop_bound(runner, entrypoint, env), None
        except RuntimeError as err:
            # Everything else is still checked; the missing bound fails the image at the end.
            bound, unstated = None, err
        before = probe.run(healthcheck, env)
        if before.returncode == 0:
            raise RuntimeError(f"HEALTHCHECK {healthcheck} answered 0 before the service ran")
        server = Service(runner, entrypoint, env, log_dir, service)
        started = time.monotonic()
        wait_healthy(probe, healthcheck, env, server)
        say(f"{service}: HEALTHCHECK {' '.join(healthcheck)}: exit {before.returncode} before "
            f"the start, 0 after {time.monotonic() - started:.1f} s")
        if service == "gorge-notification":
            ws = notification_job(ports)

            def closed(patience):
                deadline = time.monotonic() + patience
                while time.monotonic() < deadline:
                    if ws.receive()[0] == 8:
                        return
                raise RuntimeError("the WebSocket got no close frame during the drain")

            took, uid = sigterm(server, bound, closed)
        else:
            webhook_job(receiver, db)
            took, uid = sigterm(server, bound)
        stated = f"the stated bound {bound} s" if bound is not None else "no stated bound"
        say(f"{service}: ran as uid {uid}; SIGTERM: exit 0 after {took:.1f} s ({stated})")
        if unstated:
            raise unstated
    finally:
        if server:
            server.stop()
        for step in reversed(teardown):
            try:
                step()
            except (RuntimeError, OSError, subprocess.SubprocessError) as err:
                say(f"cleaning up after {service}: {err}")


def image_size(tag):
    out = run(["buildah", "images", "--format", "{{.Size}}", tag], check=False).stdout.strip()
    return out or "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", help="where the service binaries are (default: cargo's "
                        "target directory + /debug, as `cargo test --workspace` leaves them)")
    args = parser.parse_args()
    for tool in ("buildah", "mmdebstrap", "strip", "mariadb"):
        if shutil.which(tool) is None:
            sys.exit(f"check-images: {tool} is missing: apt-get install buildah mmdebstrap "
                     f"binutils mariadb-client")
    if os.geteuid() != 0:
        sys.exit("check-images: needs root (buildah's storage and chroot isolation)")
    if args.bin_dir:
        bin_dir = pathlib.Path(args.bin_dir)
    else:
        meta = json.loads(run(["cargo", "metadata", "--format-version", "1", "--no-deps"],
                              cwd=ROOT).stdout)
        bin_dir = pathlib.Path(meta["target_directory"]) / "debug"
    matrix = json.loads(run([str(ROOT / "scripts/check-release-matrix.sh"), "--matrix"]).stdout)
    license_ = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["license"]
    times = {}
    started = time.monotonic()
    remove_orphans()
    ensure_base()
    times["base"] = time.monotonic() - started
    built = []
    for entry in matrix:
        service, port = entry["service"], entry["port"]
        tag = f"localhost/{entry['image'].rsplit('/', 1)[1]}:ci"
        binary = bin_dir / service
        if not binary.is_file():
            sys.exit(f"check-images: {binary} is missing: build it first (cargo test "
                     f"--workspace --locked builds it), or pass --bin-dir")
        step = time.monotonic()
        build(service, port, binary, tag)
        times[f"build {service}"] = time.monotonic() - step
        config = check_config(service, port, tag, license_)
        if config is not None:
            built.append((service, tag, config))
    step = time.monotonic()
    prune_unused_layers()
    times["prune"] = time.monotonic() - step
    with tempfile.TemporaryDirectory(prefix="gorge-ci-run-") as log_dir:
        for service, tag, config in built:
            step = time.monotonic()
            try:
                exercise(service, tag, config, log_dir)
            except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as err:
                fail(f"{tag}: {err}")
            times[f"run {service}"] = time.monotonic() - step
    for entry in matrix:
        tag = f"localhost/{entry['image'].rsplit('/', 1)[1]}:ci"
        say(f"{tag}: {image_size(tag)}")
    say("times: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
        + f"; total {time.monotonic() - started:.0f} s")
    if failures:
        sys.exit(f"check-images: {len(failures)} failure(s)")
    say("images: both built from deploy/docker/Dockerfile, configured as the release matrix "
        "says, healthy, doing their job and stopping cleanly")


if __name__ == "__main__":
    main()
