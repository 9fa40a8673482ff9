#!/usr/bin/env bash
# Removes the gorge webhook hand-over kit from a Phorge tree: revert.sh [--check] <phorge root>
exec "$(dirname "${BASH_SOURCE[0]}")/handover.sh" revert "$@"
