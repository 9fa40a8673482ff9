#!/usr/bin/env bash
# Installs the gorge webhook hand-over kit into a Phorge tree: apply.sh [--check] <phorge root>
exec "$(dirname "${BASH_SOURCE[0]}")/handover.sh" apply "$@"
