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
    # What GORGE_WEBHOOK_OUTBOUND_BLACKLIST would refuse at start.
    bad("an IPv4 prefix over 32", lambda v: v["webhook"].__setitem__("outboundBlacklist", ["10.0.0.0/33"])),
    bad("an IPv4 octet over 255", lambda v: v["webhook"].__setitem__("outboundBlacklist", ["300.0.0.0/8"])),
    bad("an IPv6 prefix over 128", lambda v: v["webhook"].__setitem__("outboundBlacklist", ["fc00::/129"])),
    bad("two entries in one", lambda v: v["webhook"].__setitem__("outboundBlacklist", ["10.0.0.0/8,fc00::/7"])),
])
# ...while what the service takes is accepted: CIDRs of both families and single addresses.
good = copy.deepcopy(values)
good["webhook"]["outboundBlacklist"] = ["10.0.0.0/8", "192.168.1.7", "fc00::/7", "::1", "2001:db8::1/128"]
for err in validator.iter_errors(good):
    print(f"check-chart-values: FAIL: schema refuses a valid blacklist: {err.message}", file=sys.stderr)
    failures += 1
if failures:
    sys.exit(1)
print("check-chart-values: ok (defaults valid, 12 bad variants rejected, valid blacklists accepted)")
PY
