#!/usr/bin/env bash
# Chart check: `helm lint`, then render deploy/helm/gorge with the least a working install
# sets (ci/minimal-values.yaml: the chart refuses to render without it), with each component
# disabled in turn and with every optional feature on, validate each rendering
# against the Kubernetes schemas, and prove that one component's values never change the
# other component's Deployment (its pods would restart on an unrelated upgrade).
#
# Usage: scripts/check-helm-chart.sh
# Needs: helm (on PATH or named by $HELM) and a manifest validator: kubeconform (used by
# GitHub CI) or, failing that, the kubernetes-validate Python package.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
chart="${root}/deploy/helm/gorge"
helm="${HELM:-helm}"

if ! command -v "${helm}" >/dev/null; then
    echo "check-helm-chart: helm not found (set HELM or put it on PATH)" >&2
    exit 2
fi
if command -v kubeconform >/dev/null; then
    validate() { kubeconform -strict -ignore-missing-schemas -summary -; }
elif command -v kubernetes-validate >/dev/null; then
    validate() { kubernetes-validate --strict --quiet -k "${KUBERNETES_VERSION:-1.30.0}" -; }
else
    echo "check-helm-chart: need kubeconform or kubernetes-validate" >&2
    exit 2
fi

minimal="${chart}/ci/minimal-values.yaml"
render() {
    "${helm}" template gorge "${chart}" --namespace phorge -f "${minimal}" "$@"
}

"${helm}" lint --strict "${chart}" -f "${minimal}"

full=(
    --set notification.ingress.enabled=true
    --set notification.ingress.host=notify.example.com
    --set 'notification.ingress.tls[0].secretName=notify-tls'
    --set 'notification.ingress.tls[0].hosts[0]=notify.example.com'
    --set 'notification.adminAllowedFrom[0].podSelector.matchLabels.app=phorge'
    --set notification.autoscaling.enabled=true
    --set notification.monitoring.podMonitor.enabled=true
    --set notification.monitoring.serviceMonitor.enabled=true
    --set webhook.monitoring.podMonitor.enabled=true
    --set webhook.monitoring.serviceMonitor.enabled=true
    --set notification.monitoring.prometheusRule.enabled=true
    --set notification.monitoring.grafanaDashboard.enabled=true
    --set webhook.monitoring.prometheusRule.enabled=true
    --set webhook.monitoring.grafanaDashboard.enabled=true
    --set webhook.replicaCount=2
    --set webhook.mysql.host=mariadb
    --set webhook.mysql.existingSecret=phorge-db
    --set webhook.serviceToken.existingSecret=gorge-token
    --set 'webhook.outboundBlacklist[0]=10.0.0.0/8'
    --set 'webhook.outboundBlacklist[1]=fc00::/7'
)
variants=(
    "defaults|"
    "notification disabled|--set notification.enabled=false"
    "webhook disabled|--set webhook.enabled=false"
    "TLS on the client port|--set notification.tls.secretName=notify-tls"
    "TLS on both ports (broker mode)|--set notification.tls.secretName=notify-tls --set notification.tls.admin=true --set notification.broker.url=redis://redis:6379/0 --set notification.monitoring.podMonitor.enabled=true --set notification.monitoring.serviceMonitor.enabled=true"
)
for variant in "${variants[@]}"; do
    name="${variant%%|*}"
    read -r -a args <<<"${variant#*|}"
    echo "== ${name}"
    render "${args[@]}" | validate
done
echo "== everything on"
render "${full[@]}" | validate

# Expected object counts, so that a template that silently renders nothing is caught.
count_kinds() { render "$@" | grep -c '^kind: ' || true; }
expect_count() {
    local want="$1" name="$2" got
    shift 2
    got="$(count_kinds "$@")"
    if [[ "${got}" != "${want}" ]]; then
        echo "check-helm-chart: ${name}: rendered ${got} objects, expected ${want}" >&2
        exit 1
    fi
}
# notification: configmap, serviceaccount, 3 services, deployment, pdb, networkpolicy, test pod
# webhook: configmap, serviceaccount, service, deployment (no pdb: one replica)
# everything on adds an ingress, an HPA, a PodMonitor, a ServiceMonitor, a PrometheusRule and
# a dashboard ConfigMap per component, and the webhook pdb (two replicas).
expect_count 13 defaults
expect_count 4 "notification disabled" --set notification.enabled=false
expect_count 9 "webhook disabled" --set webhook.enabled=false
expect_count 24 "everything on" "${full[@]}"

echo "== one component's values leave the other's Deployment unchanged"
deployment() {
    local component="$1"
    shift
    render --show-only "templates/${component}-deployment.yaml" "$@"
}
diff <(deployment notification) \
    <(deployment notification --set webhook.namespace=other --set webhook.env.GORGE_LOG_LEVEL=debug)
diff <(deployment webhook) \
    <(deployment webhook --set notification.drainSeconds=30 --set notification.env.GORGE_LOG_LEVEL=debug)
# ...while a component's own settings do change its pod template (so the diffs can fail).
if diff -q <(deployment webhook) <(deployment webhook --set webhook.namespace=other) >/dev/null; then
    echo "check-helm-chart: webhook.namespace did not change the webhook Deployment" >&2
    exit 1
fi
if diff -q <(deployment notification) <(deployment notification --set notification.drainSeconds=30) >/dev/null; then
    echo "check-helm-chart: notification.drainSeconds did not change the notification Deployment" >&2
    exit 1
fi

echo "== values.schema.json rejects bad values"
if render --set notification.adminPort=70000 >/dev/null 2>&1; then
    echo "check-helm-chart: an admin port of 70000 was accepted" >&2
    exit 1
fi
# Template-time refusals (each asserting its message) are in scripts/check-deploy.sh.

echo "check-helm-chart: ok"
