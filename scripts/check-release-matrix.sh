#!/usr/bin/env bash
# Release-matrix consistency check: every service binary under bins/ has exactly one entry in
# .github/workflows/release.yml, and the health port in that entry is the one the service
# really listens on by default (its `DEFAULT_HEALTH_PORT: u16 = N` constant), the one the
# Helm chart probes, the one the CI docker builds and the Compose file pass as PORT, and the
# one the image's HEALTHCHECK ends up probing (its `healthcheck` reads the same default). A wrong health port fails silently in
# production (an image that stays "unhealthy" when run alone), so this fails loudly here.
#
# Usage:
#   scripts/check-release-matrix.sh [--root DIR]   check the repository (default: this one)
#   scripts/check-release-matrix.sh --matrix       check, then print the release matrix as JSON
#                                                  ([{service, port, image}], for
#                                                  scripts/check-images.py)
#   scripts/check-release-matrix.sh --self-test    prove that the check catches broken ports,
#                                                  missing entries and a missing HEALTHCHECK
#                                                  (on temporary copies, never the real files)
# Needs: bash, python3 with PyYAML. If `helm` is on PATH (or $HELM names it), the chart is
# also rendered and every Deployment's probe ports are resolved and compared.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
default_root="$(cd "${script_dir}/.." && pwd)"

# Directories under bins/ that are tools, not released services: they get no image.
# gorge-bench is the load/fault drill binary run from a workstation or CI, never deployed.
readonly TOOL_ALLOWLIST="gorge-bench"

check() {
    local root="$1" output="${2:-summary}"
    python3 - "$root" "$TOOL_ALLOWLIST" "${HELM:-helm}" "$output" <<'PY'
import json
import pathlib
import re
import shutil
import subprocess
import sys

import yaml

root = pathlib.Path(sys.argv[1])
tools = set(sys.argv[2].split())
helm = sys.argv[3]
output = sys.argv[4]
errors = []

# Which chart value is the probe port of each service.
CHART_PORT_KEYS = {
    "gorge-notification": ("notification", "adminPort"),
    "gorge-webhook": ("webhook", "port"),
}
CONST_RE = re.compile(
    r"^\s*(?:pub(?:\([a-z:]+\))?\s+)?const\s+DEFAULT_HEALTH_PORT\s*:\s*u16\s*=\s*([0-9_]+)\s*;",
    re.MULTILINE,
)


def fail(msg):
    errors.append(msg)


def load_yaml(rel):
    path = root / rel
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as err:
        fail(f"{rel}: cannot read: {err}")
        return None


def matrix_entries(workflow, rel):
    """Every `strategy.matrix.include` list of a workflow, by job name."""
    found = {}
    if not isinstance(workflow, dict):
        return found
    for job_name, job in (workflow.get("jobs") or {}).items():
        include = (((job or {}).get("strategy") or {}).get("matrix") or {}).get("include")
        if isinstance(include, list):
            found[job_name] = include
    if not found:
        fail(f"{rel}: no job with a strategy.matrix.include list")
    return found


# 1. Services: directories under bins/ with a Cargo.toml, minus the tool allowlist.
services = sorted(
    d.name for d in (root / "bins").iterdir()
    if (d / "Cargo.toml").is_file() and d.name not in tools
)
if not services:
    fail("bins/: no service found")

# 2. Each service's default health port, from its source.
source_ports = {}
for svc in services:
    hits = []
    for rs in sorted((root / "bins" / svc / "src").rglob("*.rs")):
        for m in CONST_RE.finditer(rs.read_text(encoding="utf-8")):
            hits.append((rs.relative_to(root), int(m.group(1).replace("_", ""))))
    if len(hits) != 1:
        where = ", ".join(f"{p}={n}" for p, n in hits) or "none"
        fail(f"bins/{svc}/src: expected exactly one `const DEFAULT_HEALTH_PORT: u16 = N;`, found {where}")
    else:
        source_ports[svc] = hits[0][1]

# 3. The release matrix: one entry per service, image named after it, port = source port.
release_rel = ".github/workflows/release.yml"
release = load_yaml(release_rel)
release_ports = {}
release_images = {}
for job, include in matrix_entries(release, release_rel).items():
    for entry in include:
        svc, port, image = entry.get("service"), entry.get("port"), str(entry.get("image", ""))
        release_images[svc] = image
        if svc in release_ports:
            fail(f"{release_rel}: job {job}: service {svc} listed twice")
        if svc not in services:
            fail(f"{release_rel}: job {job}: matrix entry {svc!r} is not a service under bins/")
        if not isinstance(port, int):
            fail(f"{release_rel}: job {job}: {svc}: port {port!r} is not an integer")
        if not image.endswith("/" + str(svc)):
            fail(f"{release_rel}: job {job}: {svc}: image {image!r} does not end in /{svc}")
        release_ports[svc] = port
for svc in services:
    if svc not in release_ports:
        fail(f"{release_rel}: service bins/{svc} has no release matrix entry "
             f"(or add it to TOOL_ALLOWLIST in scripts/check-release-matrix.sh if it is a tool)")
    elif svc in source_ports and release_ports[svc] != source_ports[svc]:
        fail(f"{release_rel}: {svc}: matrix port {release_ports[svc]} differs from "
             f"DEFAULT_HEALTH_PORT {source_ports[svc]} in bins/{svc}/src")
release_text = (root / release_rel).read_text(encoding="utf-8") if (root / release_rel).is_file() else ""
for arg in ("SERVICE=${{ matrix.service }}", "PORT=${{ matrix.port }}"):
    if arg not in release_text:
        fail(f"{release_rel}: build-args must pass {arg}")

# 4. CI's docker build matrix builds the same services with the same ports.
ci_rel = ".github/workflows/ci.yml"
ci = load_yaml(ci_rel)
ci_docker = {}
for job, include in matrix_entries(ci, ci_rel).items():
    for entry in include:
        if "service" in entry and "port" in entry:
            ci_docker[entry["service"]] = entry["port"]
if ci_docker != release_ports:
    fail(f"{ci_rel}: docker build matrix {ci_docker} differs from the release matrix {release_ports}")

# 5. The chart probes each service on its health port.
values = load_yaml("deploy/helm/gorge/values.yaml") or {}
for svc, (component, key) in CHART_PORT_KEYS.items():
    if svc not in services:
        fail(f"scripts/check-release-matrix.sh: CHART_PORT_KEYS names {svc}, which is not a service")
        continue
    chart_port = (values.get(component) or {}).get(key)
    if chart_port != release_ports.get(svc):
        fail(f"deploy/helm/gorge/values.yaml: {component}.{key} = {chart_port!r} differs from "
             f"the release matrix port {release_ports.get(svc)!r} of {svc}")
for svc in services:
    if svc not in CHART_PORT_KEYS:
        fail(f"scripts/check-release-matrix.sh: no chart probe port known for service {svc}")

# 5b. The chart runs the images the matrix publishes: the same registry and image name, the
# owner being whatever the chart's default names (the matrix's is the publishing account).
OWNER = "${{ github.repository_owner }}"
for svc, (component, _) in CHART_PORT_KEYS.items():
    image = release_images.get(svc, "")
    repository = ((values.get(component) or {}).get("image") or {}).get("repository")
    pattern = "^" + re.escape(image).replace(re.escape(OWNER), "[^/]+") + "$"
    if image and not re.match(pattern, str(repository)):
        fail(f"deploy/helm/gorge/values.yaml: {component}.image.repository = {repository!r} is "
             f"not the image the release matrix publishes for {svc} ({image})")

if shutil.which(helm):
    # Render and resolve each Deployment's probe ports (named ports included).
    chart = root / "deploy/helm/gorge"
    # The chart refuses to render without the values every working install sets.
    proc = subprocess.run([helm, "template", "gorge-check", str(chart),
                           "-f", str(chart / "ci/minimal-values.yaml")],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        fail(f"helm template failed: {proc.stderr.strip()}")
    else:
        component_service = {c: s for s, (c, _) in CHART_PORT_KEYS.items()}
        seen = set()
        for doc in yaml.safe_load_all(proc.stdout):
            if not doc or doc.get("kind") != "Deployment":
                continue
            component = doc["metadata"]["labels"].get("app.kubernetes.io/component")
            svc = component_service.get(component)
            if svc is None:
                fail(f"chart: Deployment {doc['metadata']['name']} has unknown component {component!r}")
                continue
            seen.add(svc)
            repository = ((values.get(CHART_PORT_KEYS[svc][0]) or {}).get("image") or {}).get("repository")
            images = [c.get("image", "") for c in doc["spec"]["template"]["spec"]["containers"]]
            if not any(str(i).startswith(f"{repository}:") for i in images):
                fail(f"chart: the {svc} Deployment runs {images}, not {repository}:<tag>")
            for container in doc["spec"]["template"]["spec"]["containers"]:
                named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
                for probe in ("livenessProbe", "readinessProbe"):
                    port = ((container.get(probe) or {}).get("httpGet") or {}).get("port")
                    port = named.get(port, port)
                    if port != release_ports.get(svc):
                        fail(f"chart: {svc} {probe} probes port {port!r}, "
                             f"expected {release_ports.get(svc)!r}")
        for svc in services:
            if svc not in seen:
                fail(f"chart: no Deployment renders for {svc} with ci/minimal-values.yaml")

# 6. Compose builds pass the same PORT.
compose_rel = "deploy/compose/docker-compose.yml"
compose = load_yaml(compose_rel) or {}
for name, spec in (compose.get("services") or {}).items():
    args = ((spec or {}).get("build") or {}).get("args") or {}
    svc = args.get("SERVICE")
    if svc is None:
        continue
    if str(args.get("PORT")) != str(release_ports.get(svc)):
        fail(f"{compose_rel}: service {name} builds {svc} with PORT={args.get('PORT')!r}, "
             f"expected {release_ports.get(svc)!r}")

# 7. The image health check runs the binary's own `healthcheck`, which probes the health port
# of the service's own configuration (the DEFAULT_HEALTH_PORT checked above, or whatever the
# container's environment moved it to); a fixed `--port` would go stale when it moves.
dockerfile_rel = "deploy/docker/Dockerfile"
dockerfile = (root / dockerfile_rel).read_text(encoding="utf-8") if (root / dockerfile_rel).is_file() else ""
joined = re.sub(r"\\\n", " ", dockerfile)
healthchecks = [l for l in joined.splitlines() if l.strip().startswith("HEALTHCHECK")]
if len(healthchecks) != 1:
    fail(f"{dockerfile_rel}: expected exactly one HEALTHCHECK, found {len(healthchecks)}")
elif not re.search(r'CMD\s+\[\s*"/usr/local/bin/gorge-service"\s*,\s*"healthcheck"\s*\]\s*$',
                   healthchecks[0]):
    fail(f'{dockerfile_rel}: HEALTHCHECK must be `CMD ["/usr/local/bin/gorge-service", "healthcheck"]` '
         f"(no --port: the binary reads its own configured health port)")
if not re.search(r"^EXPOSE \$\{PORT\}\s*$", dockerfile, re.MULTILINE):
    fail(f"{dockerfile_rel}: must `EXPOSE ${{PORT}}` (the health port build arg)")
if not re.search(r"^ARG PORT\s*$", dockerfile, re.MULTILINE):
    fail(f"{dockerfile_rel}: missing `ARG PORT`")

if errors:
    for e in errors:
        print(f"check-release-matrix: FAIL: {e}", file=sys.stderr)
    sys.exit(1)
if output == "json":
    print(json.dumps([{"service": s, "port": release_ports[s], "image": release_images[s]}
                      for s in services]))
else:
    summary = ", ".join(f"{s}={release_ports[s]}" for s in services)
    print(f"check-release-matrix: ok ({summary})")
PY
}

# Copies what the check reads into a temporary tree, applies one breakage and expects the
# check to fail; also expects the unbroken copy to pass.
self_test() {
    local failures=0
    self_test_dir="$(mktemp -d)"
    trap 'rm -rf "${self_test_dir}"' EXIT
    local tmp="${self_test_dir}"
    copy_tree() {
        local dst="$1"
        mkdir -p "${dst}"
        (cd "${default_root}" && tar cf - bins/*/Cargo.toml bins/*/src .github/workflows \
            deploy/helm/gorge deploy/compose deploy/docker) | (cd "${dst}" && tar xf -)
    }
    expect() {
        local want="$1" name="$2" edit="$3" dir="${tmp}/${2}"
        copy_tree "${dir}"
        (cd "${dir}" && eval "${edit}")
        if check "${dir}" >"${dir}.log" 2>&1; then got=pass; else got=fail; fi
        if [[ "${got}" == "${want}" ]]; then
            echo "self-test: ${name}: ${got} (as expected)"
            grep -m1 'FAIL' "${dir}.log" | sed 's/^/    /' || true
        else
            echo "self-test: ${name}: expected ${want}, got ${got}:" >&2
            cat "${dir}.log" >&2
            failures=$((failures + 1))
        fi
    }
    local got
    expect pass unchanged ':'
    expect fail release-port-changed \
        "sed -i 's/port: 22281/port: 22280/' .github/workflows/release.yml"
    expect fail source-port-changed \
        "grep -rlZ DEFAULT_HEALTH_PORT bins/gorge-webhook/src | xargs -0 sed -i -E 's/(DEFAULT_HEALTH_PORT: u16 = )[0-9_]+/\\19999/'"
    expect fail chart-port-changed \
        "sed -i 's/^  port: 8160$/  port: 8161/' deploy/helm/gorge/values.yaml"
    expect fail new-service-without-entry \
        "mkdir -p bins/gorge-newsvc/src && printf '[package]\n' >bins/gorge-newsvc/Cargo.toml && printf 'pub const DEFAULT_HEALTH_PORT: u16 = 9000;\n' >bins/gorge-newsvc/src/main.rs"
    expect fail healthcheck-removed \
        "sed -i '/^HEALTHCHECK/,/\"healthcheck\"/d' deploy/docker/Dockerfile"
    expect fail healthcheck-fixed-port \
        "sed -i 's|\"healthcheck\"\\]|\"healthcheck\", \"--port\", \"8160\"]|' deploy/docker/Dockerfile"
    expect fail chart-image-renamed \
        "sed -i 's|repository: ghcr.io/gorge/gorge-webhook$|repository: ghcr.io/gorge/gorge-hooks|' deploy/helm/gorge/values.yaml"
    expect fail compose-port-changed \
        "sed -i 's/PORT: \"8160\"/PORT: \"22281\"/' deploy/compose/docker-compose.yml"
    if command -v "${HELM:-helm}" >/dev/null; then
        # Only the rendered chart shows which port a probe really hits.
        expect fail probe-on-client-port \
            "sed -i '/readinessProbe:/,/port:/s/port: admin/port: client/' deploy/helm/gorge/templates/notification-deployment.yaml"
    else
        echo "self-test: probe-on-client-port: skipped (no helm on PATH)"
    fi
    if ((failures > 0)); then
        echo "self-test: ${failures} case(s) misbehaved" >&2
        return 1
    fi
    echo "self-test: all cases behaved"
}

main() {
    local root="${default_root}"
    case "${1:-}" in
        --self-test) self_test; return ;;
        --matrix) check "${root}" json; return ;;
        --root) root="${2:?--root needs a directory}" ;;
        "") ;;
        *) echo "usage: $0 [--root DIR | --self-test]" >&2; return 2 ;;
    esac
    check "${root}"
}

main "$@"
