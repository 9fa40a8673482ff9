#!/usr/bin/env python3
"""Checks that the crate graph drawn in docs/architecture.md is the one Cargo builds.

The drawing is the fenced ```crate-graph block of docs/architecture.md, one crate a line:

    a -> b, c        a depends on b and c (normal [dependencies] entries)
    a -dev-> d       a depends on d only in its tests ([dev-dependencies] that are not
                     also normal dependencies, which already cover the tests)
    a -> nothing     a depends on no workspace crate

Text after `#` is a comment. Every workspace member must appear in the block. The truth is
`cargo metadata --format-version 1 --no-deps`: every dependency of a workspace member on
another workspace member (a crate's dev-dependency on itself, used to switch on a feature
for its own tests, is not an edge).

Exit status 1 with the exact edges to add to or remove from the block when they differ.
`--self-test` proves the comparison fails on a wrong drawing (run by CI after the check).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
BLOCK = re.compile(r"^```crate-graph\n(.*?)^```", re.MULTILINE | re.DOTALL)
LINE = re.compile(r"^([\w-]+)\s+(->|-dev->)\s+([\w-]+(?:\s*,\s*[\w-]+)*)$")


def drawn_graph(text):
    """The edges of the crate-graph block as (from, arrow, to), every crate it names, and the
    crates drawn `-> nothing`; raises ValueError on a line that is not an edge list."""
    blocks = BLOCK.findall(text)
    if len(blocks) != 1:
        raise ValueError(f"expected one ```crate-graph block, found {len(blocks)}")
    edges, named, leaves = set(), set(), set()
    for number, line in enumerate(blocks[0].splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = LINE.match(line)
        if not match:
            raise ValueError(
                f"crate-graph line {number}: {line!r} is not 'a -> b, c', 'a -dev-> b' "
                "or 'a -> nothing'"
            )
        source, arrow, targets = match.groups()
        named.add(source)
        for target in (t.strip() for t in targets.split(",")):
            if target == "nothing":
                leaves.add(source)
            else:
                edges.add((source, arrow, target))
                named.add(target)
    return edges, named, leaves


def cargo_edges(metadata):
    """The edges between workspace members in `cargo metadata` output."""
    members = {p["name"] for p in metadata["packages"]}
    normal, dev = set(), set()
    for package in metadata["packages"]:
        for dep in package["dependencies"]:
            if dep["name"] not in members or dep["name"] == package["name"]:
                continue
            # Build dependencies would be drawn as normal ones; the workspace has none.
            (dev if dep["kind"] == "dev" else normal).add((package["name"], dep["name"]))
    edges = {(a, "->", b) for a, b in normal}
    edges |= {(a, "-dev->", b) for a, b in dev - normal}
    return edges, members


def compare(drawn, named, leaves, actual, members):
    """Readable differences between the drawing and Cargo; empty when they agree."""
    problems = []
    contradictory = sorted(leaves & {a for a, _, _ in drawn})
    if contradictory:
        problems.append(
            "drawn both '-> nothing' and with dependencies: " + ", ".join(contradictory)
        )
    unknown = sorted(named - members)
    if unknown:
        problems.append("not workspace members (misspelt or removed): " + ", ".join(unknown))
    absent = sorted(members - named)
    if absent:
        problems.append(
            "workspace members missing from the drawing (add their line, "
            "'<crate> -> nothing' if they depend on no workspace crate): " + ", ".join(absent)
        )
    missing = sorted(actual - drawn)
    if missing:
        problems.append("add to the crate-graph block of docs/architecture.md:")
        problems += [f"    {a} {arrow} {b}" for a, arrow, b in missing]
    extra = sorted(drawn - actual)
    if extra:
        problems.append("remove from the crate-graph block (Cargo.toml has no such dependency):")
        problems += [f"    {a} {arrow} {b}" for a, arrow, b in extra]
    return problems


def metadata():
    out = subprocess.run(
        # $CARGO: the cargo that runs this under `cargo test` (see gorge-testkit's tests).
        [os.environ.get("CARGO", "cargo"), "metadata", "--format-version", "1", "--no-deps", "--locked"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def check(text, meta):
    actual, members = cargo_edges(meta)
    drawn, named, leaves = drawn_graph(text)
    return compare(drawn, named, leaves, actual, members)


def self_test(meta):
    """Wrong drawings must fail, naming exactly what to change."""
    actual, members = cargo_edges(meta)
    sources = [a for a, _, _ in actual]
    # An edge whose crate keeps another line, so only the edge itself goes missing.
    left_out = sorted(e for e in actual if sources.count(e[0]) > 1)[0]
    right = [f"{a} {arrow} {b}" for a, arrow, b in sorted(actual)]
    right += [f"{m} -> nothing" for m in sorted(members - set(sources))]

    def block(lines):
        return "```crate-graph\n" + "\n".join(lines) + "\n```\n"

    cases = [
        (
            "an edge left out and one invented",
            block([l for l in right if l != "{} {} {}".format(*left_out)]
                  + ["gorge-claim -> gorge-hub"]),
            meta,
            [
                "add to the crate-graph block of docs/architecture.md:",
                "    {} {} {}".format(*left_out),
                "remove from the crate-graph block (Cargo.toml has no such dependency):",
                "    gorge-claim -> gorge-hub",
            ],
        ),
        (
            "a leaf drawn with a dependency",
            block(right + ["phorge-wire -> gorge-hub"]),
            meta,
            [
                "drawn both '-> nothing' and with dependencies: phorge-wire",
                "remove from the crate-graph block (Cargo.toml has no such dependency):",
                "    phorge-wire -> gorge-hub",
            ],
        ),
    ]
    # A crate added to the workspace (as gorge-testkit will be) is asked for by name, and a
    # dev-only dependency on it is drawn `-dev->`.
    with_new_crate = json.loads(json.dumps(meta))
    with_new_crate["packages"].append({"name": "gorge-newcrate", "dependencies": []})
    for package in with_new_crate["packages"]:
        if package["name"] == "gorge-webhook":
            package["dependencies"].append({"name": "gorge-newcrate", "kind": "dev"})
    cases.append(
        (
            "a new crate",
            block(right),
            with_new_crate,
            [
                "workspace members missing from the drawing (add their line, "
                "'<crate> -> nothing' if they depend on no workspace crate): gorge-newcrate",
                "add to the crate-graph block of docs/architecture.md:",
                "    gorge-webhook -dev-> gorge-newcrate",
            ],
        )
    )
    if check(block(right), meta):
        print("self-test: the right drawing was refused", file=sys.stderr)
        return 1
    for name, text, case_meta, expected in cases:
        problems = check(text, case_meta)
        if problems != expected:
            print(f"self-test: {name} was not reported as expected:", file=sys.stderr)
            print("\n".join(problems) or "(no differences reported)", file=sys.stderr)
            return 1
    try:
        drawn_graph("```crate-graph\ngorge-hub => phorge-wire\n```\n")
    except ValueError:
        pass
    else:
        print("self-test: a malformed edge line was accepted", file=sys.stderr)
        return 1
    print("check-architecture self-test: a wrong drawing fails, naming the edges")
    return 0


def main(argv):
    text = DOC.read_text(encoding="utf-8")
    meta = metadata()
    if argv[1:] == ["--self-test"]:
        return self_test(meta)
    if argv[1:]:
        print(f"usage: {argv[0]} [--self-test]", file=sys.stderr)
        return 2
    try:
        problems = check(text, meta)
    except ValueError as err:
        print(f"docs/architecture.md: {err}", file=sys.stderr)
        return 1
    if problems:
        print("docs/architecture.md draws a crate graph Cargo does not build:", file=sys.stderr)
        print("\n".join(problems), file=sys.stderr)
        return 1
    edges = len(drawn_graph(text)[0])
    print(f"docs/architecture.md crate graph matches cargo metadata ({edges} edges)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
