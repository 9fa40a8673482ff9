#!/usr/bin/env bash
# Shared body of apply.sh and revert.sh: installs or removes the gorge hand-over kit (the
# extension classes under src/extensions/gorge/ and herald-delegation.patch) in a Phorge tree.
# Idempotent; refuses, before changing anything, a tree the patch neither applies to nor is
# already applied to. Usage: handover.sh apply|revert [--check] <phorge root>
set -euo pipefail

kit="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
patch_file="${kit}/herald-delegation.patch"
ext_src="${kit}/src/extensions/gorge"
ext_rel="src/extensions/gorge"

die() { printf 'gorge kit: %s\n' "$*" >&2; exit 1; }
say() { printf 'gorge kit: %s\n' "$*"; }

usage() { die "usage: $(basename "$0") [--check] <phorge root>"; }

action="${1:-}"; shift || true
check_only=0
if [ "${1:-}" = "--check" ]; then check_only=1; shift; fi
[ $# -eq 1 ] || usage
root="$(cd "$1" 2>/dev/null && pwd)" || die "no such directory: $1"

for marker in src/__phutil_library_init__.php \
  src/applications/herald/storage/HeraldWebhookRequest.php \
  src/applications/herald/worker/HeraldWebhookWorker.php; do
  [ -f "${root}/${marker}" ] || die "${root} is not a Phorge tree (missing ${marker})"
done

# Patch with git when present, else patch(1). GIT_CEILING_DIRECTORIES keeps git from treating
# a Phorge tree that sits inside some other repository as a subdirectory of it.
run_patch() { # run_patch forward|reverse check|apply
  local direction="$1" mode="$2" args=()
  if command -v git >/dev/null 2>&1; then
    [ "${direction}" = reverse ] && args+=(--reverse)
    [ "${mode}" = check ] && args+=(--check)
    (cd "${root}" && GIT_CEILING_DIRECTORIES="$(dirname "${root}")" \
      git apply "${args[@]}" "${patch_file}") >/dev/null 2>&1
  elif command -v patch >/dev/null 2>&1; then
    args=(-p1 --forward --fuzz=0 --silent)
    [ "${direction}" = reverse ] && args=(-p1 --reverse --fuzz=0 --silent)
    [ "${mode}" = check ] && args+=(--dry-run)
    (cd "${root}" && patch "${args[@]}" <"${patch_file}") >/dev/null 2>&1
  else
    die "neither git nor patch is installed"
  fi
}

if run_patch forward check; then
  state=unpatched
elif run_patch reverse check; then
  state=patched
else
  die "herald-delegation.patch neither applies to nor is applied in ${root}: the Herald files \
differ from the Phorge this kit was made for (local changes, or a Phorge release that moved \
them). Nothing was changed."
fi

total=0 present=0 same=0
for f in "${ext_src}"/*.php; do
  target="${root}/${ext_rel}/$(basename "${f}")"
  total=$((total + 1))
  if [ -f "${target}" ]; then
    present=$((present + 1))
    cmp -s "${f}" "${target}" && same=$((same + 1))
  fi
done
if [ "${same}" -eq "${total}" ]; then ext_state=current
elif [ "${present}" -eq 0 ]; then ext_state=absent
else ext_state=different; fi

say "${root}: patch ${state}, extension classes ${ext_state}"
[ "${check_only}" -eq 1 ] && exit 0
if [ "${action}" = apply ] && [ "${state}" = patched ] && [ "${ext_state}" = current ]; then
  say "already applied; nothing changed"; exit 0
fi
if [ "${action}" = revert ] && [ "${state}" = unpatched ] && [ "${ext_state}" = absent ]; then
  say "not applied; nothing changed"; exit 0
fi

case "${action}" in
  apply)
    # Classes first: the patched files call GorgeWebhookDelegation.
    if [ "${ext_state}" != current ]; then
      mkdir -p "${root}/${ext_rel}"
      for f in "${ext_src}"/*.php; do
        cp "${f}" "${root}/${ext_rel}/$(basename "${f}")"
      done
      say "installed ${ext_rel}/"
    fi
    if [ "${state}" = unpatched ]; then
      run_patch forward apply || die "applying herald-delegation.patch failed after a clean check"
      say "applied herald-delegation.patch"
    fi
    say "done. Next: restart PHP (web server / php-fpm) and the daemons (bin/phd restart), run \
bin/storage adjust, then set gorge.webhook.uri (docs/operations.md)."
    ;;
  revert)
    # Patch first, so that no code calls a class that is gone.
    if [ "${state}" = patched ]; then
      run_patch reverse apply || die "reverting herald-delegation.patch failed after a clean check"
      say "reverted herald-delegation.patch"
    fi
    if [ "${ext_state}" != absent ]; then
      for f in "${ext_src}"/*.php; do
        rm -f "${root}/${ext_rel}/$(basename "${f}")"
      done
      rmdir "${root}/${ext_rel}" 2>/dev/null || true
      say "removed ${ext_rel}/"
    fi
    say "done. Restart PHP and the daemons (bin/phd restart); Phorge delivers webhooks itself \
again. bin/storage adjust drops the key_status index if you want it gone."
    ;;
  *) usage ;;
esac
