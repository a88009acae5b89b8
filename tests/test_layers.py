"""The layers docs/architecture.md promises, read from the code: the import graph
(function-level imports included, ``TYPE_CHECKING`` blocks aside), who touches pids,
and how big a class may grow. Each rule names what breaks it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_distrain"
# the bench's training programs: run as train.py by workers, never imported, and they
# use the package's public face as any notebook's cell does
PROGRAMS = "jupyter_distrain.client.bench.programs"
MAX_CLASS_LINES = 250
# where a pid may be signalled or sampled: the one owner of the primitives, the
# launchers (the host agent among them) and the supervisor's warden
PID_OWNERS = (
    "jupyter_distrain.processes",
    "jupyter_distrain.launchers",
    "jupyter_distrain.supervisor.warden",
)
PID_CALLS = {
    ("os", "kill"),
    ("os", "killpg"),
    ("psutil", "Process"),
    ("psutil", "pid_exists"),
    ("psutil", "process_iter"),
}
PID_METHODS = {"send_signal", "terminate", "kill"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {
    _module_name(path): path
    for path in sorted(PACKAGE.rglob("*.py"))
    if not _module_name(path).startswith(PROGRAMS)
}


def _nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:`` (imports for type hints only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                yield child
                yield from _nodes(child)
            continue
        yield node
        yield from _nodes(node)


def _known(name: str) -> str | None:
    """The package's module ``name`` is, or is in (``a.b.C`` -> ``a.b``); None: not ours."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in _nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(t for t in map(_known, targets) if t and t != module)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _layer(module: str) -> str:
    """The top-level folder (or module) of the package ``module`` is in."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(package)"


def _edges(source: str, target: str) -> list[str]:
    """``a -> b`` for each import of a module under ``source`` from one under ``target``."""
    return [
        f"{module} -> {imported}"
        for module, imports in sorted(GRAPH.items())
        if module.startswith(source)
        for imported in sorted(imports)
        if imported.startswith(target)
    ]


def test_no_module_imports_itself_through_others():
    assert _circles(GRAPH) == []


def test_no_two_layers_import_each_other():
    layers: dict[str, set[str]] = {}
    for module, imports in GRAPH.items():
        if _layer(module) == "(package)":  # the public face imports what it offers
            continue
        layers.setdefault(_layer(module), set()).update(
            _layer(i) for i in imports if _layer(i) != _layer(module)
        )
    assert _circles(layers) == []


def test_the_contract_imports_nothing_of_the_package_but_itself():
    contract = "jupyter_distrain.contract"
    assert [
        f"{module} -> {imported}"
        for module, imports in sorted(GRAPH.items())
        if module.startswith(contract)
        for imported in sorted(imports)
        if not imported.startswith(contract)
    ] == []


@pytest.mark.parametrize("layer", ["backends", "pool", "worker", "contract"])
def test_backends_the_pool_and_workers_import_no_launcher(layer):
    assert _edges(f"jupyter_distrain.{layer}", "jupyter_distrain.launchers") == []


@pytest.mark.parametrize(
    "rules", ["jupyter_distrain.contract.cellcheck", "jupyter_distrain.backends"]
)
def test_no_launcher_reads_a_cell_or_asks_a_backend(rules):
    """What a job needs of a launcher is the backend's to say (``Backend.needs``), met with
    what the launcher gives once at submit (``plugins.check_support``)."""
    assert _edges("jupyter_distrain.launchers", rules) == []


def test_workers_import_only_the_contract():
    allowed = ("jupyter_distrain.contract", "jupyter_distrain.worker", "jupyter_distrain.version")
    assert [
        f"{module} -> {imported}"
        for module, imports in sorted(GRAPH.items())
        if module.startswith("jupyter_distrain.worker")
        for imported in sorted(imports)
        if not imported.startswith(allowed)
    ] == []


def test_the_host_agent_reaches_no_client_supervisor_backend_or_other_launcher():
    """What ``python -m jupyter_distrain.launchers.agent`` loads on a host: the contract,
    processes, a host's warm pool and the process handles; nothing of the notebook's side
    (the backend it checks at preflight is loaded by name through the plugins)."""
    reached, todo = set(), ["jupyter_distrain.launchers.agent.__main__"]
    while todo:
        for imported in GRAPH[todo.pop()]:
            if imported not in reached:
                reached.add(imported)
                todo.append(imported)
    allowed = (
        "jupyter_distrain.contract",
        "jupyter_distrain.launchers.agent",
        "jupyter_distrain.launchers.handles",
        "jupyter_distrain.launchers.gpus",
        "jupyter_distrain.pool",
        "jupyter_distrain.processes",
        "jupyter_distrain.plugins",
        "jupyter_distrain.frameworks",
        "jupyter_distrain.timing",
        "jupyter_distrain.version",
    )
    assert sorted(m for m in reached if not m.startswith(allowed)) == []


def _pid_uses(module: str) -> list[str]:
    found = []
    for node in _nodes(ast.parse(MODULES[module].read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Name) and (owner.id, node.func.attr) in PID_CALLS:
            found.append(f"{module}:{node.lineno} {owner.id}.{node.func.attr}")
        elif node.func.attr in PID_METHODS:
            found.append(f"{module}:{node.lineno} .{node.func.attr}()")
    return found


def test_only_the_owners_of_pids_signal_or_sample_them():
    assert [
        use
        for module in sorted(MODULES)
        if not module.startswith(PID_OWNERS)
        for use in _pid_uses(module)
    ] == []


def test_no_class_is_longer_than_a_reader_can_hold():
    long = []
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    long.append(f"{module}.{node.name}: {lines} lines")
    assert long == []


MAX_RUNTIME_METHODS = 15  # a launcher's runtime part (Launcher), its own methods
FATE = ("fail", "stop", "finish")  # the supervisor's verbs that end a job


def _classes(module: str) -> Iterator[ast.ClassDef]:
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.ClassDef):
            yield node


def _decorated(node: ast.FunctionDef, name: str) -> bool:
    return any(isinstance(d, ast.Name) and d.id == name for d in node.decorator_list)


def test_a_launchers_runtime_part_is_small_and_its_submit_time_part_apart():
    """``Launcher`` (what the supervisor runs) holds no class-level checks: those are its
    ``LauncherKind``'s; each launcher names its kind."""
    found = {}
    for module in MODULES:
        if not module.startswith("jupyter_distrain.launchers"):
            continue
        for cls in _classes(module):
            bases = {b.id for b in cls.bases if isinstance(b, ast.Name)}
            if "Launcher" in bases or (cls.name == "Launcher" and "ABC" in bases):
                methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
                assigned = {
                    t.id
                    for n in cls.body
                    if isinstance(n, ast.Assign)
                    for t in n.targets
                    if isinstance(t, ast.Name)
                }
                found[cls.name] = (
                    len(methods),
                    [m.name for m in methods if _decorated(m, "classmethod")],
                    "kind" in assigned or cls.name == "Launcher",
                )
    assert set(found) >= {
        "Launcher",
        "LocalLauncher",
        "SshLauncher",
        "SlurmLauncher",
        "RayLauncher",
    }
    for name, (_, classmethods, has_kind) in found.items():
        assert classmethods == [] and has_kind, name
    assert found["Launcher"][0] <= MAX_RUNTIME_METHODS


def _calls_on(module: str, owner: str, names: tuple[str, ...]) -> list[str]:
    calls = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            if node.func.attr in names and isinstance(target, ast.Name) and target.id == owner:
                calls.append(f"{module}:{node.lineno} {owner}.{node.func.attr}")
    return calls


def test_a_jobs_fate_is_decided_by_the_policy_alone():
    """Only ``supervisor/policy.py`` ends a job (fail, stop, finish); every other part of
    the supervisor reports what it saw to it."""
    elsewhere = [
        call
        for module in sorted(MODULES)
        if module.startswith("jupyter_distrain.supervisor.")
        and module != "jupyter_distrain.supervisor.policy"
        for owner in ("sup", "self", "supervisor")
        for call in _calls_on(module, owner, FATE)
        # the verbs themselves (core), and what is not the job (a stacks request's end)
        if not module.endswith((".core", ".stacks", ".channels", ".__init__"))
    ]
    assert elsewhere == []
    assert _calls_on("jupyter_distrain.supervisor.policy", "sup", FATE)  # the rule sees calls


def test_the_rules_see_a_circle_and_a_function_level_import():
    """The reader itself: a circle through a function-level import is one."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    source = "def f():\n    from .x import y\nif TYPE_CHECKING:\n    from .z import w\n"
    imports = [n for n in _nodes(ast.parse(source)) if isinstance(n, ast.ImportFrom)]
    assert [n.module for n in imports] == ["x"]
    assert any("os.killpg" in use for use in _pid_uses("jupyter_distrain.processes"))
