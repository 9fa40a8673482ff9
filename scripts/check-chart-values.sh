#!/usr/bin/env bash
# Chart values check that needs no helm: deploy/helm/gorge/values.yaml must validate against
# values.schema.json (helm refuses to install otherwise), and the schema must still reject a
# few known-bad values (value combinations are refused by the templates instead, checked by
# scripts/check-deploy.sh), so a schema loosened to "anything goes" fails here too.
# Needs: python3 with PyYAML and jsonschema.
set -euo pipefail

chart="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/deploy/helm/gorge"

python3 - "${chart}" <<'PY'
import copy
import json
import sys

import jsonschema
import yaml

chart = sys.argv[1]
with open(f"{chart}/values.schema.json", encoding="utf-8") as fh:
    schema = json.load(fh)
with open(f"{chart}/values.yaml", encoding="utf-8") as fh:
    values = yaml.safe_load(fh)
jsonschema.Draft7Validator.check_schema(schema)
validator = jsonschema.Draft7Validator(schema)
errors = sorted(validator.iter_errors(values), key=str)
for err in errors:
    path = ".".join(str(p) for p in err.absolute_path)
    print(f"check-chart-values: FAIL: values.yaml {path}: {err.message}", file=sys.stderr)
if errors:
    sys.exit(1)

def bad(description, edit):
    broken = copy.deepcopy(values)
    edit(broken)
    if validator.is_valid(broken):
        print(f"check-chart-values: FAIL: schema accepts {description}", file=sys.stderr)
        return 1
    return 0

failures = sum([
    bad("an admin port above 65535", lambda v: v["notification"].__setitem__("adminPort", 70000)),
    bad("a webhook port of 0", lambda v: v["webhook"].__setitem__("port", 0)),
    bad("an unknown webhook key", lambda v: v["webhook"].__setitem__("mysqlHost", "db")),
    bad("a blacklist entry that is not a CIDR",
        lambda v: v["webhook"].__setitem__("outboundBlacklist", ["example.com"])),
    bad("a negative preStop sleep",
        lambda v: v["webhook"].__setitem__("preStopSleepSeconds", -1)),
    bad("a webhook delivery timeout of 0",
        lambda v: v["webhook"].__setitem__("deliveryTimeoutSeconds", 0)),
    bad("maxSockets as a string",
        lambda v: v["notification"].__setitem__("maxSockets", "50000")),
    bad("a missing notification.adminPort", lambda v: v["notification"].pop("adminPort")),
])
if failures:
    sys.exit(1)
print("check-chart-values: ok (defaults valid, 8 bad variants rejected)")
PY
