"""Checks on a cell body before anything is launched.

Design decision
---------------

- **Undefined names**: the cell is parsed and names that are read but bound
  nowhere in it (nor builtins) are listed in a warning that suggests `--push`
  for notebook variables and an import for modules. It is a warning, not an
  error: the analysis cannot see names created dynamically.
"""

from __future__ import annotations

import ast
import builtins

from .spec import JobSpec, SpecError

# Names a worker's namespace always has.
_PROVIDED = {"__name__", "__file__", "__builtins__", "result"}


def check_syntax(code: str, first_line: int = 2) -> None:
    """Compile ``code``; a syntax error becomes a :class:`SpecError` with the cell line.

    ``first_line`` is the cell line the body starts on (line 1 holds ``%%distributed``).
    """
    try:
        compile(code, "train.py", "exec")
    except SyntaxError as exc:
        lineno = exc.lineno or 1
        raise SpecError(
            f"syntax error in the cell at line {lineno + first_line - 1} "
            f"(train.py line {lineno}): {exc.msg}"
        ) from None


def undefined_names(code: str) -> list[str]:
    """Names the code reads but never binds anywhere (nor are builtins), sorted.
    Code that does not parse has none here: :func:`check_syntax` reports it."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    bound: set[str] = set()
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            if node.name != "*":
                bound.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            bound.update(node.names)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    if any(isinstance(n, ast.ImportFrom) and n.names[0].name == "*" for n in ast.walk(tree)):
        return []  # a star import may define anything
    return sorted(loaded - bound - set(dir(builtins)) - _PROVIDED)


def defines_tf1_run(code: str) -> bool:
    """Whether the cell defines ``run(cluster, server, task_index)`` at top level: Cloudera's
    TF1 contract, which the ps backend runs in :attr:`~.process.Mode.TF1_RUN`."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    return any(
        isinstance(node, ast.FunctionDef)
        and node.name == "run"
        and len(node.args.posonlyargs) + len(node.args.args) == 3
        for node in tree.body
    )


def imported_packages(code: str) -> set[str]:
    """The top-level packages the cell imports (``import torch.nn`` -> ``torch``)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.partition(".")[0])
    return found


KERAS_BACKEND = "KERAS_BACKEND"


def keras_backend_set(code: str) -> str | None:
    """The Keras backend the cell sets before importing Keras, if it does
    (``os.environ["KERAS_BACKEND"] = "jax"`` or ``os.environ.setdefault(...)``)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and _is_constant(target.slice, KERAS_BACKEND):
                    return str(node.value.value)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setdefault"
            and len(node.args) == 2
            and _is_constant(node.args[0], KERAS_BACKEND)
            and isinstance(node.args[1], ast.Constant)
        ):
            return str(node.args[1].value)
    return None


def _is_constant(node: ast.AST, value: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == value


def uses_horovod_elastic(code: str) -> bool:
    """Whether the cell uses Horovod's elastic API (``hvd.elastic.run`` and friends)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "elastic":
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(".elastic"):
            return True
    return False


def resizes_in_place(spec: JobSpec) -> bool:
    """Whether the job is a Horovod elastic one (Gloo), which scaling resizes in place."""
    return (
        spec.backend == "horovod" and spec.controller == "gloo" and uses_horovod_elastic(spec.code)
    )


def elastic_warnings(code: str) -> list[str]:
    """What in an elastic Horovod cell will keep it from scaling, said before it runs."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "TensorFlowState":
            return [
                "hvd.elastic.TensorFlowState cannot take in a joining worker in eager mode "
                "(it broadcasts in its constructor): scaling this job will fail; use "
                "hvd.elastic.TensorFlowKerasState or KerasState"
            ]
    return []
