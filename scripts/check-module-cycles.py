#!/usr/bin/env python3
"""Fails when the modules of a crate or binary import each other in a cycle.

A module that needs a module which needs it back is two jobs tangled into one: neither can be
read, tested or moved without the other. The rule, for every crate root of every workspace
member (`src/lib.rs`, `src/main.rs`, `src/bin/*.rs`, `tests/*.rs`, `benches/*.rs`, with the
files their `mod` lines name):

- a file is a node (inline `mod x { … }` blocks, `mod tests` included, belong to their file);
- a path in the code is an edge from its file to the file of the module it names: `use
  crate::a::b`, `super::…`, `self::…`, `$crate::…` in a macro, a path starting with a child
  module's name (`reader::run`), in `use` lines or anywhere else in the code, comments and
  string literals left out; a name the target re-exports (`pub use x::Y`) is followed to
  where it is defined;
- an edge to one's own ancestor is not counted: a child module is part of its parent (it may
  use its parent's private items by design), so `use super::Shared` in `broker/reader.rs` is
  fine, while `broker/mod.rs -> state.rs -> broker/mod.rs` is a cycle.

Exit status 1 naming each cycle file by file, with the line of every edge; 0 with a one-line
summary otherwise. `--self-test` proves the check finds cycles (and only cycles) in small
made-up crates; `--list` prints every cycle and exits 0 (for recording them).
"""

import re
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# --- reading Rust: code without comments and literals --------------------------------------

# Where a comment or a literal may start: the scan jumps from one to the next.
OPENER = re.compile(r"""//|/\*|(?<![\w])[bc]?r#*"|(?<![\w])[bc]?"|"|'""")
CHAR = re.compile(r"'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")
STRING_END = re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL)


def strip(text):
    """`text` with comments, strings and char literals blanked (newlines kept, so offsets and
    line numbers stay those of the file)."""
    out = []
    i, n = 0, len(text)

    def blanked(a, b):
        return re.sub(r"[^\n]", " ", text[a:b])

    while (m := OPENER.search(text, i)) is not None:
        out.append(text[i:m.start()])
        start, token = m.start(), m.group()
        if token == "//":
            j = text.find("\n", start)
            j = n if j < 0 else j
        elif token == "/*":
            depth, j = 1, start + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
        elif token == "'":
            # A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a), which stays.
            c = CHAR.match(text, start)
            if c is None:
                out.append("'")
                i = start + 1
                continue
            j = c.end()
        elif "r" in token:
            close = '"' + token[token.index("r") + 1:-1]
            j = text.find(close, m.end())
            j = n if j < 0 else j + len(close)
        else:
            e = STRING_END.match(text, m.end())
            j = n if e is None else e.end()
        out.append(blanked(start, j))
        i = j
    out.append(text[i:])
    return "".join(out)


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def matching_brace(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code)


def parse_use_tree(text):
    """`a::{b, c::d as e, self, *}` → [(segments, alias)], alias None for a glob."""
    text = re.sub(r"\s+", "", text)
    results = []

    def walk(prefix, s):
        # Split s at top-level commas.
        parts, depth, start = [], 0, 0
        for k, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:k])
                start = k + 1
        parts.append(s[start:])
        for part in filter(None, parts):
            brace = part.find("{")
            if brace >= 0:
                head = part[:brace].rstrip(":")
                segments = prefix + [x for x in head.split("::") if x]
                walk(segments, part[brace + 1:part.rfind("}")])
                continue
            segs = [x for x in part.split("::") if x]
            if segs and segs[-1] == "*":
                results.append((prefix + segs[:-1], None))
                continue
            if segs and segs[-1] == "self":
                segs = segs[:-1]
                full = prefix + segs
                results.append((full, full[-1] if full else None))
                continue
            full = prefix + segs
            results.append((full, full[-1] if full else None))

    walk([], text)
    return results


USE = re.compile(r"(?<![\w$])use\s+([^;]*);")
ALIAS = re.compile(r"\b(\w+)\s+as\s+(\w+)\b")
MOD_DECL = re.compile(r"(?<![\w])mod\s+(\w+)\s*;")
MOD_INLINE = re.compile(r"(?<![\w])mod\s+(\w+)\s*\{")
ABSOLUTE = re.compile(r"(?<![\w$:.])(\$crate|crate|super|self)((?:\s*::\s*(?:\w+|\{))+)")
RELATIVE = re.compile(r"(?<![\w$:.'])([a-z_][a-z0-9_]*)\s*::\s*(\w+|\{)")


class File:
    def __init__(self, path, module, rel):
        self.path = path
        self.module = tuple(module)  # the module path of the file itself
        self.rel = rel  # as printed
        self.text = path.read_text(encoding="utf-8")
        self.code = strip(self.text)
        self.inline = []  # (start, end, name)
        for m in MOD_INLINE.finditer(self.code):
            brace = m.end() - 1
            self.inline.append((brace, matching_brace(self.code, brace), m.group(1)))

    def module_at(self, offset):
        names = [name for start, end, name in sorted(self.inline) if start < offset < end]
        return self.module + tuple(names)

    def inline_modules(self):
        for start, _, _ in self.inline:
            yield self.module_at(start + 1)


class Crate:
    """One crate root and the files its `mod` lines reach."""

    def __init__(self, member_dir, root_file):
        self.member_dir = member_dir
        self.root = root_file
        self.files = {}  # module path -> File
        self.modules = set()  # every module path, inline ones included
        self.uses = {}  # module path -> {name: (context module, segments)}
        self._load(root_file, (), is_root=True)
        for f in self.files.values():
            for m in f.inline_modules():
                self.modules.add(m)
            for m in USE.finditer(f.code):
                context = f.module_at(m.start())
                body = m.group(1)
                aliases = {a: b for a, b in ALIAS.findall(body)}
                plain = ALIAS.sub(lambda x: x.group(1), body)
                for segments, name in parse_use_tree(plain):
                    if name is None or not segments:
                        continue
                    name = aliases.get(name, name)
                    self.uses.setdefault(context, {})[name] = (context, segments)

    def _load(self, path, module, is_root=False):
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        f = File(path, module, rel)
        self.files[tuple(module)] = f
        self.modules.add(tuple(module))
        # Children of a file live next to it (mod.rs, lib.rs, main.rs) or in a directory
        # named after it (foo.rs → foo/).
        if is_root or path.name == "mod.rs":
            base = path.parent
        else:
            base = path.parent / path.stem
        for m in MOD_DECL.finditer(f.code):
            if f.module_at(m.start()) != tuple(module):
                continue  # `mod x;` inside an inline module: not used in this workspace
            name = m.group(1)
            for candidate in (base / f"{name}.rs", base / name / "mod.rs"):
                if candidate.exists():
                    self._load(candidate, tuple(module) + (name,))
                    break

    def file_of(self, module):
        """The file a module path is in (an inline module is in its file)."""
        module = tuple(module)
        while module not in self.files:
            module = module[:-1]
        return self.files[module]

    def name(self, module):
        """A module as the report names it: its file, and `::x` for an inline `mod x`."""
        f = self.file_of(module)
        inline = module[len(f.module):]
        return f.rel + "".join(f"::{n}" for n in inline)

    def resolve(self, context, first, rest, depth=0):
        """The module a path names: `first` is crate/$crate/super/self or a child module's
        name, `rest` the segments after it. None when it leaves the crate."""
        if first in ("crate", "$crate"):
            current = ()
        elif first == "super":
            current = context[:-1]
        elif first == "self":
            current = context
        elif context + (first,) in self.modules:
            current = context + (first,)
        else:
            return None
        segments = list(rest)
        while segments and segments[0] == "super":
            current = current[:-1]
            segments.pop(0)
        for seg in segments:
            if seg in ("{", "*"):
                break
            if current + (seg,) in self.modules:
                current = current + (seg,)
                continue
            # An item of `current`: follow a re-export to where the item is.
            imported = self.uses.get(current, {}).get(seg)
            if imported and depth < 8:
                ctx, segs = imported
                target = self.resolve(ctx, segs[0], segs[1:], depth + 1)
                if target is not None:
                    return target
            break
        return current

    def edges(self):
        """{(from module, to module): line of the first path} for every counted edge, modules
        named as [`Crate.name`] names them."""
        found = {}
        for f in self.files.values():
            offsets = {}

            def add(offset, target):
                if target is None:
                    return
                source = f.module_at(offset)
                if source[: len(target)] == target:
                    return  # itself, or one of its ancestors
                key = (self.name(source), self.name(target))
                offsets[key] = min(offsets.get(key, offset), offset)

            for m in USE.finditer(f.code):
                context = f.module_at(m.start())
                plain = ALIAS.sub(lambda x: x.group(1), m.group(1))
                for segments, _ in parse_use_tree(plain):
                    if segments:
                        add(m.start(), self.resolve(context, segments[0], segments[1:]))
            for m in ABSOLUTE.finditer(f.code):
                segs = [s for s in re.split(r"\s*::\s*", m.group(2)) if s]
                add(m.start(), self.resolve(f.module_at(m.start()), m.group(1), segs))
            for m in RELATIVE.finditer(f.code):
                context = f.module_at(m.start())
                if context + (m.group(1),) in self.modules:
                    tail = self.code_path_tail(f.code, m.start())
                    add(m.start(), self.resolve(context, m.group(1), tail))
            found.update((key, line_of(f.code, offset)) for key, offset in offsets.items())
        return found

    @staticmethod
    def code_path_tail(code, start):
        m = re.compile(r"\w+((?:\s*::\s*\w+)*)").match(code, start)
        return [s for s in re.split(r"\s*::\s*", m.group(1)) if s]


# --- cycles --------------------------------------------------------------------------------

def strongly_connected(nodes, edges):
    """Tarjan's components of more than one node."""
    graph = {n: sorted(b for a, b in edges if a == n) for n in nodes}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def shortest_cycle(component, edges):
    """A shortest cycle through the first file of `component`, as files, first one last too."""
    members = set(component)
    start = component[0]
    graph = {n: sorted(b for a, b in edges if a == n and b in members) for n in members}
    previous, frontier = {start: None}, [start]
    while frontier:
        following = []
        for v in frontier:
            for w in graph[v]:
                if w == start:
                    path = [v]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    raise ValueError(f"no cycle through {start}")


def crate_roots(member_dir):
    roots = []
    for name in ("src/lib.rs", "src/main.rs"):
        if (member_dir / name).exists():
            roots.append(member_dir / name)
    for folder in ("src/bin", "tests", "benches", "examples"):
        d = member_dir / folder
        if d.is_dir():
            roots += sorted(d.glob("*.rs"))
            roots += sorted(p for p in d.glob("*/main.rs"))
    return roots


def members(root):
    manifest = tomllib.loads((root / "Cargo.toml").read_text(encoding="utf-8"))
    found = []
    for pattern in manifest.get("workspace", {}).get("members", []):
        found += sorted(p for p in root.glob(pattern) if (p / "Cargo.toml").exists())
    return found


def cycles(root):
    """[(crate root file, component, edges)] for every cycle of the workspace at `root`."""
    found = []
    for member in members(root):
        for root_file in crate_roots(member):
            crate = Crate(member, root_file)
            edges = crate.edges()
            nodes = {crate.name(m) for m in crate.modules}
            for component in strongly_connected(nodes, set(edges)):
                found.append((crate, component, edges))
    return found


def describe(crate, component, edges, every_edge=False):
    rel = crate.root.relative_to(ROOT).as_posix() if crate.root.is_relative_to(ROOT) else str(crate.root)
    cycle = shortest_cycle(component, set(edges))
    lines = [f"{rel}: {len(component)} modules import each other in a cycle: " + ", ".join(component)]
    lines.append("  for example:")
    for a, b in zip(cycle, cycle[1:]):
        lines.append(f"    {a}:{edges[(a, b)]} -> {b}")
    if every_edge:
        lines.append("  every edge between them:")
        inside = sorted((a, b) for a, b in edges if a in component and b in component)
        lines += [f"    {a}:{edges[(a, b)]} -> {b}" for a, b in inside]
    return "\n".join(lines)


# --- self-test -----------------------------------------------------------------------------

def self_test():
    global ROOT
    cases = {
        "a cycle through use lines and a plain path": (
            {
                "src/lib.rs": "mod a;\nmod b;\nmod c;\n",
                "src/a.rs": "use crate::b::B;\npub struct A;\n",
                "src/b.rs": "pub struct B(pub crate::c::C);\n",
                "src/c.rs": "use crate::{a::A};\npub struct C;\n",
            },
            ["src/a.rs", "src/b.rs", "src/c.rs"],
        ),
        "a parent and its child's sibling": (
            {
                "src/lib.rs": "mod p;\nmod state;\n",
                "src/p/mod.rs": "mod reader;\npub fn start() { reader::run() }\npub struct Shared;\n",
                "src/p/reader.rs": "use super::Shared;\nuse crate::state::State;\npub fn run() {}\n",
                "src/state.rs": "pub struct State(crate::p::Shared);\n",
            },
            ["src/p/mod.rs", "src/p/reader.rs", "src/state.rs"],
        ),
        "a re-export followed to its module": (
            {
                "src/lib.rs": "mod a;\nmod b;\npub use b::B;\n",
                "src/a.rs": "use crate::B;\npub struct A;\n",
                "src/b.rs": "use super::a::A;\npub struct B;\n",
            },
            ["src/a.rs", "src/b.rs"],
        ),
        "no cycle: a test module using helpers that use the module's parent": (
            {
                "src/lib.rs": "mod hub;\n",
                "src/hub/mod.rs": "mod publish;\n#[cfg(test)]\nmod testing;\npub use publish::Publisher;\n",
                "src/hub/publish.rs": (
                    "pub struct Publisher;\n#[cfg(test)]\nmod tests {\n    use crate::hub::testing::*;\n}\n"
                ),
                "src/hub/testing.rs": "use super::Publisher;\npub fn hub() {}\n",
            },
            [],
        ),
        "no cycle: children using their parent, tests, comments and strings": (
            {
                "src/lib.rs": "pub mod a;\nmod b;\npub use a::A;\n",
                "src/a.rs": (
                    "mod child;\npub struct A;\npub fn f() { child::g() }\n"
                    "// use crate::b::B;\n/* crate::b::B */\nconst S: &str = \"crate::b::B\";\n"
                    "const R: &str = r#\"super::b\"#;\nfn l<'a>(x: &'a str) -> char { 'x' }\n"
                    "#[cfg(test)]\nmod tests { use super::*; use self::inner::X; mod inner { pub struct X; } }\n"
                ),
                "src/a/child.rs": "use super::A;\nuse crate::a::f;\npub fn g() {}\n",
                "src/b.rs": "use crate::A;\npub struct B;\n",
            },
            [],
        ),
    }
    saved = ROOT
    failures = 0
    for name, (files, expected) in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            ROOT = Path(tmp)
            (ROOT / "Cargo.toml").write_text('[workspace]\nmembers = ["x"]\n')
            for rel, text in files.items():
                path = ROOT / "x" / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            (ROOT / "x" / "Cargo.toml").write_text('[package]\nname = "x"\n')
            found = cycles(ROOT)
            got = [f.removeprefix("x/") for _, c, _ in found for f in c]
            if got != expected:
                print(f"self-test: {name}: expected {expected}, found {got}", file=sys.stderr)
                failures += 1
            elif found:
                text = describe(*found[0])
                if "->" not in text or not all(e in text for e in expected):
                    print(f"self-test: {name}: the report does not name the cycle:\n{text}",
                          file=sys.stderr)
                    failures += 1
    ROOT = saved
    if failures:
        return 1
    print("check-module-cycles self-test: cycles are found and named, and only cycles")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if argv[1:] not in ([], ["--list"]):
        print(f"usage: {argv[0]} [--self-test | --list]", file=sys.stderr)
        return 2
    found = cycles(ROOT)
    for crate, component, edges in found:
        listing = argv[1:] == ["--list"]
        print(describe(crate, component, edges, every_edge=listing),
              file=sys.stdout if listing else sys.stderr)
    if found and argv[1:] == []:
        print(f"{len(found)} module import cycle(s): move what ties the files into a module "
              "both can use (docs/architecture.md, \"No import cycles\")", file=sys.stderr)
        return 1
    if not found:
        print("no module import cycles in any crate")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
