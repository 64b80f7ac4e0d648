"""dlrt's imports point down and never form a circle.

Every `import` statement of every module (lazy ones inside functions included) is read with
`ast`. Packages are ranked from the bottom (errors, kernels) to the top (server, CLI); a module
may import from its own rank or a lower one, never upward, and the module graph has no cycle.
Adding a package means giving it a rank here, the rank ARCHITECTURE.md's table gives its folder.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import dlrt

ROOT = Path(dlrt.__file__).resolve().parent
RANKS = [  # bottom to top
    ("dlrt.errors", "dlrt.env", "dlrt.resources", "dlrt.outputs", "dlrt.progress"),
    ("dlrt.kernels",),
    ("dlrt.decoding", "dlrt.tokenizer", "dlrt.stops"),
    ("dlrt.ops",),
    ("dlrt.attention",),
    ("dlrt.layers",),
    ("dlrt.models",),
    ("dlrt.checkpoint", "dlrt.tuning"),
    ("dlrt.runtime", "dlrt.distributed"),
    ("dlrt.engine.config", "dlrt.engine"),
    ("dlrt.llm", "dlrt"),
    ("dlrt.server", "dlrt.bench", "dlrt.entrypoints", "dlrt.__main__", "dlrt.train",
     "dlrt.eval"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("dlrt", *parts)).removesuffix(".__init__")


def is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def imports(path: Path) -> set[str]:
    """The dlrt modules a file imports (`from pkg import mod` counts as pkg.mod)."""
    mod = module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.split(".")[0] != "dlrt":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if is_module(sub) else base)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "dlrt"}
    out.discard(mod)
    return out


def rank(name: str) -> tuple[int, str]:
    """(rank, the ranked prefix) of a module: its longest listed prefix."""
    best = None
    for i, names in enumerate(RANKS):
        for prefix in names:
            if (name == prefix or name.startswith(prefix + ".")) and \
                    (best is None or len(prefix) > len(best[1])):
                best = (i, prefix)
    assert best is not None, f"{name} has no rank in RANKS"
    return best


GRAPH = {module_name(p): imports(p) for p in ROOT.rglob("*.py")}


def test_every_module_has_a_rank():
    for name in GRAPH:
        rank(name)


def test_imports_point_down():
    upward = []
    for name, targets in GRAPH.items():
        r = rank(name)[0]
        for t in targets:
            if rank(t)[0] > r:
                upward.append(f"{name} -> {t}")
    assert not upward, upward


def test_no_import_circles():
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for t in sorted(GRAPH.get(name, ())):
            if state.get(t) == 1:
                cycles.append(path[path.index(t):] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


def architecture_ranks() -> dict[str, int]:
    """The rank of each package (folder or top-level module) in ARCHITECTURE.md's table."""
    text = (ROOT.parent / "ARCHITECTURE.md").read_text(encoding="utf-8")
    out = {}
    for number, cell in re.findall(r"^\| (\d+) \| ([^|]+) \|", text, re.MULTILINE):
        for entry in re.findall(r"`([\w.]+/?)`", cell):
            stem = entry.removesuffix("/").removesuffix(".py")
            out["dlrt" if stem == "__init__" else f"dlrt.{stem}"] = int(number)
    return out


def test_the_ranks_are_architecture_md_s():
    """Every package of ARCHITECTURE.md's table sits at its rank here, and so does every
    listed module of a folder in that table (a module ranks with its folder)."""
    table = architecture_ranks()
    assert len(table) > 15 and table["dlrt.models"] == 6
    listed = {prefix: i for i, names in enumerate(RANKS) for prefix in names}
    assert {name: listed.get(name) for name in table} == table
    apart = {prefix: (i, table[folder(prefix)]) for prefix, i in listed.items()
             if folder(prefix) in table and table[folder(prefix)] != i}
    assert not apart, f"ranked apart from their folder (here, ARCHITECTURE.md): {apart}"


def test_lazy_imports_count():
    """An import inside a function is an edge too (a circle hidden in a function is still a
    circle): the engine imports the default model's maker only when it needs it."""
    assert "dlrt.checkpoint.default" in GRAPH["dlrt.engine.engine"]
    assert "dlrt.kernels.skinny_gemm" in GRAPH["dlrt.layers.quant.unquantized"]


def test_front_doors_know_no_ranks():
    """The server, the CLI and the benchmarks import nothing of `dlrt.distributed`: the LLM
    sends rank 0's calls to the other ranks, which follow it inside `LLM(...)`."""
    doors = ("dlrt.server", "dlrt.entrypoints", "dlrt.bench", "dlrt.__main__")
    leaks = sorted(f"{name} -> {t}" for name, targets in GRAPH.items()
                   if name.startswith(doors) for t in targets
                   if t == "dlrt.distributed" or t.startswith("dlrt.distributed."))
    assert not leaks, leaks


def folder(name: str) -> str:
    """The folder of dlrt a module lives in (`dlrt.runtime.persistent.plan` -> `dlrt.runtime`;
    a top-level module is its own)."""
    return ".".join(name.split(".")[:2])


def test_no_folder_imports_a_folder_that_imports_it_back():
    """Folders form no circle either: a folder whose modules import a second folder is never
    imported back by that folder's modules, directly or through others."""
    edges: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        edges.setdefault(folder(name), set()).update(
            folder(t) for t in targets if folder(t) != folder(name))

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            x = todo.pop()
            for y in edges.get(x, ()):
                if y == b:
                    return True
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
        return False

    back = sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if reaches(b, a))
    assert not back, back
