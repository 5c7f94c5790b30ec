"""The shape of the package: no import cycles, torch-free vocabulary and store."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent / "src" / "stitchlab"


def _modules() -> dict[str, Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Every stitchlab module each module imports (at the top or inside functions)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for cand in [target] + [f"{target}.{a.name}" for a in node.names]:
                    if cand in mods and cand != m:
                        edges[m].add(cand)
            elif isinstance(node, ast.Import):
                edges[m].update(a.name for a in node.names if a.name in mods)
    return edges


def test_no_import_cycles_between_modules():
    """Package __init__ files re-export; every other module's imports form a DAG."""
    mods = _modules()
    edges = _imports(mods)
    packages = {m for m, p in mods.items() if p.name == "__init__.py"}
    state: dict[str, int] = {}
    cycles = []

    def visit(u: str, path: list[str]) -> None:
        state[u] = 1
        for v in sorted(edges[u] - packages):
            if state.get(v) == 1:
                cycles.append(path[path.index(v) :] + [v])
            elif v not in state:
                visit(v, [*path, v])
        state[u] = 2

    for m in sorted(set(mods) - packages):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_vocabulary_and_store_import_without_torch():
    # stitchlab/__init__ imports torch: load the two modules from their files directly
    code = (
        "import importlib.util, sys\n"
        "for name in ('vocabulary', 'store'):\n"
        f"    spec = importlib.util.spec_from_file_location(name, r'{ROOT}/' + name + '.py')\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
