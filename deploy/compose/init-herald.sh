#!/usr/bin/env bash
# MariaDB init script for the local Compose run (run by the image's entrypoint on the first
# start of an empty data directory, after the root password is set): creates Phorge's
# {namespace}_herald tables from compat/herald-schema.sql, standing in for Phorge's
# `bin/storage upgrade`.
set -euo pipefail
namespace="${GORGE_NAMESPACE:-phabricator}"
sed "s/{\$NAMESPACE}/${namespace}/g" /gorge/herald-schema.sql \
    | mariadb --protocol=socket -uroot -p"${MARIADB_ROOT_PASSWORD}"
