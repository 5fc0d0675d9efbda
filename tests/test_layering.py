"""The import rules of docs/design.md section 1 and of each package's docstring.

Statically, from the source (every ``import`` of every module of pipelines/, transforms/,
loaders/ and schemas/, at the top and inside functions, except under ``if TYPE_CHECKING:``): no
import cycles, each layer imports only what its docstring allows (:data:`RULES`), and no
package reaches a third-party package its runtime lacks. Dynamically, in fresh interpreters:
every module imports while an import hook makes the forbidden top-level packages unimportable,
so a leak fails here instead of on a Dataflow worker or in a training job.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from collections.abc import Iterable
from typing import NamedTuple

import pytest
from lmshards_testing import ROOT, run_with_blocked_imports

WALK = """
import importlib, pkgutil
for package in sys.argv[2].split(","):
    skip = set(filter(None, sys.argv[3].split(","))) if len(sys.argv) > 3 else set()
    module = importlib.import_module(package)
    names = [package]
    if hasattr(module, "__path__"):
        names += [m.name for m in pkgutil.walk_packages(module.__path__, package + ".")]
    for name in names:
        if name not in skip:
            importlib.import_module(name)
print("ok")
"""


def _probe(blocked: str, packages: str, skip: str = "") -> subprocess.CompletedProcess:
    return run_with_blocked_imports(WALK, blocked, packages, skip)


@pytest.mark.parametrize(
    "blocked, packages, skip",
    [
        # Dataflow workers do not install torch.
        ("torch", "pipelines,transforms,schemas", ""),
        # A training job installs torch, not Beam.
        ("apache_beam", "loaders,schemas,transforms.objectives", ""),
        # Objectives are pure numpy; schemas need only pyarrow.
        ("apache_beam,torch,tokenizers,pyarrow,webdataset", "transforms.objectives", ""),
        ("apache_beam,torch,tokenizers,numpy", "schemas", ""),
    ],
)
def test_import_rules(blocked, packages, skip):
    result = _probe(blocked, packages, skip)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_the_probe_catches_a_leak():
    result = _probe("numpy", "transforms.objectives")
    assert result.returncode != 0 and "blocked import of numpy" in result.stderr


def test_loaders_package_imports_without_torch():
    result = run_with_blocked_imports("import loaders, loaders.access.reader\nprint('ok')\n", "torch,apache_beam")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


# -- the static rules: every import statement of ours, read from the source ----------------------

PACKAGES = ("pipelines", "transforms", "loaders", "schemas")

#: What each layer may import, from its package docstring and docs/design.md section 1: the
#: project modules besides its own (a layer's name stands for all its modules, any other name
#: for that one module) and the third-party packages (the standard library is always allowed).
#: A layer is a package without its subpackages: "transforms" is the modules beside the stages
#: (elements, handoff, ...), "loaders" those beside loaders' subpackages (dataset, mixture, ...).
ANY_BUT_TORCH = "anything but torch"
_STAGE_SHARED = ("transforms", "transforms.objectives", "schemas")
RULES: dict[str, tuple[tuple[str, ...], frozenset[str] | str]] = {
    "schemas": ((), frozenset({"pyarrow"})),
    # schemas.errors: the registry raises ConfigError where it refuses a plugin, importing it in that
    # function (the schemas package imports pyarrow; ONLY_REACHED keeps it out of the import)
    "transforms.objectives": (("schemas.errors",), frozenset({"numpy"})),
    # ShardPiece (elements) carries the examples stored by column from building to writing.
    "transforms": (("transforms.objectives", "schemas", "transforms.writing.columns"), frozenset({"numpy", "tqdm"})),
    "transforms.reading": (("transforms", "schemas"), frozenset({"apache_beam", "pyarrow", "zstandard"})),
    "transforms.tokenizing": ((*_STAGE_SHARED, "transforms.reading"),
                              frozenset({"apache_beam", "numpy", "tokenizers", "fastokens"})),
    "transforms.packing": (("transforms", "transforms.objectives"), frozenset({"apache_beam", "numpy"})),
    "transforms.building": ((*_STAGE_SHARED, "transforms.writing.columns"), frozenset({"apache_beam", "numpy"})),
    # google: the GCS client of Beam's gcp extra (the output lock's conditional write)
    "transforms.writing": ((*_STAGE_SHARED, "transforms.reading", "transforms.packing"),
                           frozenset({"apache_beam", "google", "numpy", "pyarrow"})),
    "loaders": (("loaders.access", "loaders.collation", "loaders.streaming", "schemas", "transforms.objectives"),
                frozenset({"numpy", "torch", "tokenizers"})),
    "loaders.access": (("schemas", "loaders.errors", "loaders.collation.batch"),
                       frozenset({"numpy", "pyarrow", "fsspec", "gcsfs"})),
    "loaders.collation": (("transforms.objectives", "loaders.errors"), frozenset({"numpy", "torch"})),
    "loaders.streaming": (("loaders.collation", "schemas"), frozenset({"numpy", "torch"})),
    "loaders.integrations": (("loaders", "loaders.access", "loaders.collation", "loaders.streaming",
                              "loaders.inspection", "schemas", "transforms.objectives"),
                             frozenset({"torch", "transformers"})),
    "loaders.inspection": (("schemas", "transforms.objectives", "transforms.tokenizing.text_rules", "loaders.access",
                            "loaders.errors"), frozenset({"numpy", "pyarrow", "tokenizers"})),
    "pipelines": (("schemas", "transforms", "transforms.objectives", "transforms.reading", "transforms.tokenizing",
                   "transforms.packing", "transforms.building", "transforms.writing", "loaders.inspection"),
                  ANY_BUT_TORCH),
}

#: Third-party packages no module of a package reaches through our imports at any depth (the
#: packages an import runs first included, function-local imports too): a Dataflow worker has no
#: torch, a training job no Beam. (pipelines/ reaches the collators through ``loaders/__init__``
#: for inspection, which import torch inside the functions it never calls: its rule is the direct
#: one in :data:`RULES` and the probe in fresh interpreters above.)
NEVER_REACHED = {"transforms": {"torch"}, "loaders": {"apache_beam"}}
#: The only third-party packages that importing a module of these layers loads (through the
#: imports at the top, at any depth): the loader and plugins import the objectives, and the
#: schemas are read by both sides.
ONLY_REACHED = {"transforms.objectives": {"numpy"}, "schemas": {"pyarrow"}}


class Import(NamedTuple):
    importer: str
    target: str  #: a module of ours, or a third-party or standard library module
    line: int
    local: bool  #: inside a function


def project_modules(root: pathlib.Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, pathlib.Path]:
    """Every module of ``packages`` under ``root`` by dotted name (a package by its own name)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> list[Import]:
    """The imports of one module, at the top and inside functions, except under ``if TYPE_CHECKING:``.
    ``from a import b`` imports module ``a.b`` where that is one of ours, else ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                for statement in child.orelse:
                    visit_one(statement, local)
            else:
                visit_one(child, local)

    def visit_one(node: ast.AST, local: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(name, alias.name, node.lineno, local) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(name, sub if sub in modules else base, node.lineno, local))
        visit(node, local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def all_imports(root: pathlib.Path, packages: tuple[str, ...] = PACKAGES) -> list[Import]:
    modules = project_modules(root, packages)
    return [i for name, path in modules.items() for i in imports_of(name, path, modules)]


def import_graph(imports: list[Import], modules: Iterable[str]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (itself left out)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for i in imports:
        if i.target in graph and i.target != i.importer:
            graph[i.importer].add(i.target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle ``[a, b, ..., a]`` for each group of modules that import each other (a strongly
    connected component of more than one module), shortest through the group's first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    cycles = []
    for group in sorted(groups):
        start, members = group[0], set(group)
        came_from: dict[str, str] = {}
        queue = [start]
        while start not in came_from:  # breadth first from start until an import leads back to it
            node = queue.pop(0)
            for nxt in sorted(graph[node] & members):
                if nxt not in came_from:
                    came_from[nxt] = node
                    queue.append(nxt)
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(came_from[path[-1]])
        cycles.append(path[::-1])
    return cycles


def layer_of(module: str) -> str:
    """The layer a module is in: the longest name in :data:`RULES` that is the module or a package of it."""
    candidates = [layer for layer in RULES if module == layer or module.startswith(layer + ".")]
    return max(candidates, key=len)


def _allowed(importer_layer: str, target: str) -> bool:
    names, _ = RULES[importer_layer]
    return layer_of(target) in (importer_layer, *names) or target in names


def _third_party(target: str) -> str | None:
    top = target.split(".")[0]
    return None if top in PACKAGES or top in sys.stdlib_module_names else top


def _where(i: Import) -> str:
    return f"{i.importer}:{i.line}" + (" (in a function)" if i.local else "")


@pytest.fixture(scope="module")
def source_imports() -> list[Import]:
    return all_imports(ROOT)


def test_no_import_cycles(source_imports):
    graph = import_graph(source_imports, project_modules(ROOT))
    lines = {(i.importer, i.target): i.line for i in source_imports}
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(
        " -> ".join(f"{a} (line {lines[a, b]})" for a, b in zip(c, c[1:])) + f" -> {c[-1]}" for c in cycles)


def test_every_package_has_a_rule_and_every_rule_names_what_exists():
    modules = project_modules(ROOT)
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    assert packages == set(RULES)
    named = {name for names, _ in RULES.values() for name in names}
    assert named <= set(modules), sorted(named - set(modules))


def test_each_layer_imports_only_what_its_docstring_allows(source_imports):
    bad = []
    for i in source_imports:
        layer = layer_of(i.importer)
        third_party = _third_party(i.target)
        _, allowed = RULES[layer]
        if i.target.split(".")[0] in PACKAGES:
            if not _allowed(layer, i.target):
                bad.append(f"{_where(i)} imports {i.target}, which {layer} may not import")
            continue
        if third_party is None:  # the standard library
            continue
        refused = third_party == "torch" if allowed == ANY_BUT_TORCH else third_party not in allowed
        if refused:
            bad.append(f"{_where(i)} imports {third_party}, which {layer} may not import")
    assert not bad, "\n".join(bad)


def _reached(imports: list[Import], modules: dict[str, pathlib.Path], start: str) -> dict[str, set[str]]:
    """Module of ours reached from ``start`` through ``imports`` -> the third-party packages it imports
    (importing a.b.c runs a and a.b first)."""
    graph = import_graph(imports, modules)
    for name in modules:
        parts = name.split(".")
        graph[name] |= {".".join(parts[:n]) for n in range(1, len(parts))}
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    outside: dict[str, set[str]] = {name: set() for name in seen}
    for i in imports:
        if i.importer in seen and _third_party(i.target):
            outside[i.importer].add(_third_party(i.target))
    return outside


def test_no_package_reaches_what_its_runtime_lacks(source_imports):
    modules = project_modules(ROOT)
    at_the_top = [i for i in source_imports if not i.local]
    bad = []
    for name in modules:
        never = NEVER_REACHED.get(name.split(".")[0], set())
        for module, packages in sorted(_reached(source_imports, modules, name).items()):
            bad.extend(f"{name} reaches {p} through {module}" for p in sorted(packages & never))
        only = ONLY_REACHED.get(layer_of(name))
        if only is not None:
            for module, packages in sorted(_reached(at_the_top, modules, name).items()):
                bad.extend(f"importing {name} imports {p} through {module}" for p in sorted(packages - only))
    assert not bad, "\n".join(bad)


def test_the_checker_finds_a_cycle_hidden_in_a_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import B\n\nA = 1\n")
    (package / "b.py").write_text("B = 2\n\n\ndef later():\n    from pkg.c import C\n\n    return C\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\n\nfrom pkg import a\n\n"
                                  "if TYPE_CHECKING:\n    from pkg.d import D\nC = a.A\n")
    (package / "d.py").write_text("from pkg.c import C\n\nD = C\n")
    imports = all_imports(tmp_path, ("pkg",))
    assert Import("pkg.b", "pkg.c", 5, True) in imports
    assert all(i.target != "pkg.d" for i in imports)  # under TYPE_CHECKING: not imported at run time
    graph = import_graph(imports, project_modules(tmp_path, ("pkg",)))
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}, "pkg.d": {"pkg.c"}}
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    graph["pkg.b"].clear()
    assert find_cycles(graph) == []
    assert find_cycles({"x": {"y"}, "y": {"x", "z"}, "z": {"w"}, "w": {"z"}}) == [["w", "z", "w"], ["x", "y", "x"]]


def test_the_rules_refuse_a_later_stage_pipelines_and_the_torch_side():
    assert not _allowed("transforms.reading", "transforms.tokenizing.tokenize")  # a later stage
    assert not _allowed("transforms.building", "transforms.writing.write")  # only the column store
    assert _allowed("transforms.building", "transforms.writing.columns")
    assert not _allowed("transforms", "loaders.dataset") and not _allowed("loaders", "pipelines.cli")
    assert not _allowed("loaders.streaming", "loaders.integrations.hf")
    assert not _allowed("transforms.objectives", "schemas.manifest") and not _allowed("schemas", "transforms.elements")
    assert _allowed("loaders.inspection", "transforms.tokenizing.text_rules")
    assert not _allowed("loaders.inspection", "transforms.tokenizing.tokenize")
    assert layer_of("transforms.elements") == "transforms" and layer_of("loaders.errors") == "loaders"
