#!/usr/bin/env python3
"""Checks one service's alerting rules and Grafana dashboard against a real /metrics of it.

Called by the service's `tests/monitoring.rs`, which starts the real binary and scrapes it
twice (BEFORE and AFTER, some poll rounds apart):

    check-monitoring.py SERVICE BEFORE AFTER

for SERVICE gorge-notification or gorge-webhook, with the files in
deploy/helm/gorge/files/monitoring/ (the chart renders them; VM users load them as they are):
SERVICE.rules.yml, dashboards/SERVICE.json and tests/SERVICE.scenarios.yml. It fails when

- `promtool check metrics` finds anything in AFTER (help text, types, names);
- `promtool check rules` refuses the rules;
- a rule or dashboard query names a metric that AFTER does not have, or selects a label value
  (`name{label="value"}`) no series of AFTER has; or a rule's text names a log event or
  setting (NOTIFY_*, WEBHOOK_*, GORGE_*) that no docs/ table lists;
- `promtool test rules` fails: every scenario runs on top of every series of AFTER (counters
  going on at the rate seen between BEFORE and AFTER, gauges at their AFTER value, `up` 1,
  under job=SERVICE, instance="target"); a scenario's `series` replace the real series they
  match, and must match at least one; at each `at` time, the alerts listed must be firing
  with those labels and every other alert of the file must not;
- an alert of the rules fires in no scenario (each alert is tested), or a scenario names an
  alert that is not in the rules.

Nothing here lists metric names: a metric the service starts exposing is in AFTER, so new
metrics need no edit. Needs python3 with PyYAML, and promtool (Debian's `prometheus`).
"""

import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
MONITORING = ROOT / "deploy/helm/gorge/files/monitoring"
# Steps of the generated input series: enough for the longest scenario (2 h at 1 m).
STEPS = 180
JOB_INSTANCE = (("job", None), ("instance", "target"))

LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
METRIC = re.compile(r"(?<![:\w$])((?:gorge|process)_[a-z0-9_]+)\b(?!:)")
SELECTOR = re.compile(r"\b((?:gorge|process)_[a-z0-9_]+)\{([^}]*)\}")
NAMED_THING = re.compile(r"\b((?:NOTIFY|WEBHOOK|GORGE)_[A-Z0-9_]*[A-Z0-9])\b")


def fail(errors):
    for error in errors:
        print(f"check-monitoring: FAIL: {error}", file=sys.stderr)
    sys.exit(1)


def unescape(value):
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def escape(value):
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse_exposition(text):
    """Prometheus text format -> ({series key: value}, {sample name: family type}, family names)."""
    samples, types, kinds = {}, {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        pairs = tuple((k, unescape(v)) for k, v in LABEL.findall(labels))
        samples[(name, pairs)] = float(value)
    for name, _ in samples:
        family = next((f for f in (name, re.sub(r"_(bucket|sum|count)$", "", name)) if f in types), None)
        kinds[name] = types.get(family, "untyped")
    return samples, kinds, set(types)


def series_text(name, labels):
    inner = ",".join(f'{k}="{escape(v)}"' for k, v in labels)
    return f"{name}{{{inner}}}"


def number(value):
    return repr(float(value)) if value != int(value) else str(int(value))


def baseline(service, before, after, kinds):
    """Every series of AFTER as promtool input: counters extrapolated, gauges held."""
    target = tuple((k, v or service) for k, v in JOB_INSTANCE)
    series = {}
    for (name, labels), value in after.items():
        step = 0.0
        if kinds[name] in ("counter", "histogram"):
            step = max(0.0, value - before.get((name, labels), value))
        series[(name, target + labels)] = f"{number(value)}+{number(step)}x{STEPS}"
    series[("up", target)] = f"1+0x{STEPS}"
    return series


def matches(pattern, key):
    """Does the override key `name{a="b"}` select the real series `key`?"""
    name, _, labels = pattern.partition("{")
    wanted = {k: unescape(v) for k, v in LABEL.findall(labels)}
    return key[0] == name and all(dict(key[1]).get(k) == v for k, v in wanted.items())


def strip_annotations(rules):
    """promtool compares annotations exactly; the copy tested has none (their templates are
    checked by `promtool check rules` on the original)."""
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return rules


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    service, before_path, after_path = sys.argv[1:]
    promtool = shutil.which("promtool")
    if not promtool:
        fail(["promtool is not installed (Debian: apt-get install prometheus)"])
    rules_path = MONITORING / f"{service}.rules.yml"
    dashboard_path = MONITORING / "dashboards" / f"{service}.json"
    scenarios_path = MONITORING / "tests" / f"{service}.scenarios.yml"
    errors = []

    after_text = pathlib.Path(after_path).read_text(encoding="utf-8")
    run = subprocess.run([promtool, "check", "metrics"], input=after_text, text=True,
                         capture_output=True, check=False)
    if run.returncode != 0 or run.stdout.strip() or run.stderr.strip():
        errors.append(f"promtool check metrics on {service}'s /metrics:\n{run.stdout}{run.stderr}")
    run = subprocess.run([promtool, "check", "rules", str(rules_path)], text=True,
                         capture_output=True, check=False)
    if run.returncode != 0:
        errors.append(f"promtool check rules {rules_path}:\n{run.stdout}{run.stderr}")
    if errors:
        fail(errors)

    before, _, _ = parse_exposition(pathlib.Path(before_path).read_text(encoding="utf-8"))
    after, kinds, families = parse_exposition(after_text)
    # Sample names, and family names (a histogram's, without _bucket/_sum/_count).
    names = {name for name, _ in after} | families
    rules = yaml.safe_load(rules_path.read_text(encoding="utf-8"))
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    dashboard = json.loads(dashboard_path.read_text(encoding="utf-8"))

    def queries(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query") and isinstance(value, str):
                    yield value
                else:
                    yield from queries(value)
        elif isinstance(node, list):
            for item in node:
                yield from queries(item)

    exprs = [(f"{rules_path.name}: {r.get('alert')}", text)
             for g in rules["groups"] for r in g["rules"]
             for text in [r["expr"], *(r.get("annotations") or {}).values()]]
    exprs += [(f"{dashboard_path.name}: query", q) for q in queries(dashboard)]
    if not any(where.startswith(dashboard_path.name) for where, _ in exprs):
        errors.append(f"{dashboard_path}: no panel queries found")
    for where, expr in exprs:
        for name in METRIC.findall(expr):
            if name not in names:
                errors.append(f"{where} names {name}, which {service}'s /metrics does not have")
        for name, matchers in SELECTOR.findall(expr):
            for label, value in re.findall(r'([a-zA-Z_]\w*)\s*=\s*"([^"]*)"', matchers):
                if "$" in value:
                    continue
                if not any(n == name and dict(l).get(label) == value for n, l in after):
                    errors.append(f'{where} selects {name}{{{label}="{value}"}}, which no series '
                                  f"of {service}'s /metrics has")

    documented = set()
    for page in (ROOT / "docs").glob("*.md"):
        documented.update(re.findall(r"^\| `([A-Z0-9_]+)`", page.read_text(encoding="utf-8"), re.M))
    for thing in sorted(set(NAMED_THING.findall(rules_path.read_text(encoding="utf-8")))):
        if thing not in documented:
            errors.append(f"{rules_path.name} names {thing}, which no table in docs/ lists")

    scenarios = yaml.safe_load(scenarios_path.read_text(encoding="utf-8"))
    real = baseline(service, before, after, kinds)
    tests, fired = [], set()
    for scenario in scenarios:
        title = scenario["name"]
        series = dict(real)
        matched = []
        for pattern, values in (scenario.get("series") or {}).items():
            keys = [key for key in real if matches(pattern, key)]
            if not keys:
                errors.append(f"{scenarios_path.name}: '{title}': {pattern} matches no series of "
                              f"{service}'s /metrics")
            for key in keys:
                series[key] = values
            matched += keys

        def fill(labels, title=title, matched=matched):
            out = {}
            for key, value in labels.items():
                value = str(value)
                if value.startswith("$"):
                    found = {dict(k[1]).get(value[1:]) for k in matched} - {None}
                    if len(found) != 1:
                        errors.append(f"'{title}': {value} is not one label value of the series "
                                      f"it replaces ({sorted(found)})")
                    value = found.pop() if found else ""
                out[key] = value
            return out

        cases = []
        for check in scenario["checks"]:
            firing = {}
            for alert in check.get("firing") or []:
                if alert["alert"] not in alerts:
                    errors.append(f"'{title}': no alert {alert['alert']} in {rules_path.name}")
                firing.setdefault(alert["alert"], []).append({"exp_labels": fill(alert["labels"])})
                fired.add(alert["alert"])
            for name in alerts:
                cases.append({"eval_time": check["at"], "alertname": name,
                              "exp_alerts": firing.get(name, [])})
        tests.append({
            "name": title,
            "interval": "1m",
            "input_series": [{"series": series_text(n, l), "values": v}
                             for (n, l), v in sorted(series.items())],
            "alert_rule_test": cases,
        })
    for name in alerts:
        if name not in fired:
            errors.append(f"{scenarios_path.name}: no scenario makes {name} fire")
    if errors:
        fail(errors)

    with tempfile.TemporaryDirectory() as work:
        work = pathlib.Path(work)
        (work / "rules.yml").write_text(yaml.safe_dump(strip_annotations(rules)), encoding="utf-8")
        (work / "tests.yml").write_text(yaml.safe_dump({
            "rule_files": ["rules.yml"],
            "evaluation_interval": "1m",
            "tests": tests,
        }, sort_keys=False), encoding="utf-8")
        run = subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=work, text=True,
                             capture_output=True, check=False)
        if run.returncode != 0:
            fail([f"promtool test rules ({service}, {len(tests)} scenarios on "
                  f"{len(after)} real series):\n{run.stdout}{run.stderr}"])
    print(f"check-monitoring: {service}: {len(alerts)} alerts, {len(tests)} scenarios on "
          f"{len(after)} real series, {len(exprs)} queries: ok")


if __name__ == "__main__":
    main()
