#!/usr/bin/env python3
"""Medians per scenario from measure.sh's JSON lines, as Markdown tables for docs/benchmarks.md.

Usage: summarize.py [/tmp/gorge-bench-results.jsonl]
"""
import json
import statistics
import sys
from collections import defaultdict


def get(d, path):
    for key in path.split("."):
        if not isinstance(d, dict) or d.get(key) is None:
            return None
        d = d[key]
    return d


def median(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(values)


def fmt(v, digits=2):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


NOTIFY = [
    ("runs", None),
    ("sockets", "sockets_opened"),
    ("stuck", "stuck_opened"),
    ("delivered", "delivered"),
    ("expected", "expected"),
    ("lost", "lost"),
    ("dup", "duplicates"),
    ("deliveries/s", "deliveries_per_s"),
    ("POST p50 ms", "admin_post_ms.p50_ms"),
    ("POST p99 ms", "admin_post_ms.p99_ms"),
    ("POST max ms", "admin_post_ms.max_ms"),
    ("frame p50 ms", "post_to_frame_ms.p50_ms"),
    ("frame p99 ms", "post_to_frame_ms.p99_ms"),
    ("frame max ms", "post_to_frame_ms.max_ms"),
    ("RSS B/socket", "server_rss_per_socket_bytes"),
    ("CPU µs/frame", "server_cpu_us_per_frame"),
    ("closed early", "sockets_closed_early"),
    ("stuck closed", "stuck_closed_by_server"),
    ("hub fan-out p99 ≤ ms", "server_metrics.fanout_p99_le_ms"),
    ("slow-consumer closes", "server_metrics.slow_consumer_disconnects"),
]

WEBHOOK = [
    ("runs", None),
    ("rows", "rows"),
    ("sent", "sent"),
    ("not final", "not_final"),
    ("deliveries/s", "deliveries_per_s"),
    ("per process", "deliveries_per_s_per_process"),
    ("insert→delivery p50 ms", "insert_to_delivery_ms.p50_ms"),
    ("p99 ms", "insert_to_delivery_ms.p99_ms"),
    ("dup", "duplicates"),
    ("max/hook", "max_concurrent_per_hook"),
    ("webhook CPU µs/delivery", "webhook_cpu_us_per_delivery"),
    ("MariaDB CPU s", "cpu_s.mariadb"),
    ("wall s", "wall_s"),
]


def table(title, columns, groups):
    print(f"\n### {title}\n")
    print("| scenario | " + " | ".join(c for c, _ in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for scenario, runs in groups:
        cells = []
        for _, path in columns:
            if path is None:
                cells.append(str(len(runs)))
            else:
                cells.append(fmt(median(get(r, path) for r in runs)))
        print(f"| {scenario} | " + " | ".join(cells) + " |")


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/gorge-bench-results.jsonl"
    by_scenario = defaultdict(list)
    with open(path) as lines:
        for line in lines:
            line = line.strip()
            if line:
                run = json.loads(line)
                by_scenario[run.get("scenario", "?")].append(run)
    notify = [(s, r) for s, r in by_scenario.items() if r[0].get("command") == "notify"]
    webhook = [(s, r) for s, r in by_scenario.items() if r[0].get("command") == "webhook"]
    if notify:
        table("Notification (medians)", NOTIFY, notify)
    if webhook:
        table("Webhook (medians)", WEBHOOK, webhook)
    for scenario, runs in by_scenario.items():
        if runs[0].get("command") != "drill":
            continue
        print(f"\n### Drills ({scenario})\n")
        for drill in runs[-1].get("drills", []):
            print(f"- **{drill['name']}**: {drill['verdict']}")
            for check in drill.get("checks", []):
                mark = "holds" if check["holds"] else "BROKEN"
                print(f"  - {check['must_hold']}: {mark} ({check['detail']})")


if __name__ == "__main__":
    main()
