"""Warming AutoGraph's conversions in a pooled process, without starting TensorFlow.

Most of a Keras job's first step is AutoGraph turning library functions (Keras's
``train_step``, the optimizer, Horovod's allreduce helpers: about a hundred) into
graph code. The conversion is pure Python, cached per code object and options, and
needs no TensorFlow runtime; running a warm-up step would need one, and an
initialised runtime is what a job's program must still be able to configure (visible
GPUs, memory growth, thread counts). So rank 0 of a job records which library
functions it converted (file, line, name, options), and an idle pooled process
converts the same ones before it says it is ready: the job's first trace then finds
them in the cache. Best effort: what cannot be found or converted is skipped.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import sys
import types
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_ENTRIES = 5000


def _transpiler() -> Any:
    from tensorflow.python.autograph.impl import api

    return api._TRANSPILER


def record(path: Path) -> int:
    """Write the library functions this process converted to ``path``; how many."""
    if "tensorflow" not in sys.modules:
        return 0
    modules = _modules_by_file()
    entries = []
    try:
        cache = _transpiler()._cache._cache
    except (ImportError, AttributeError):
        return 0
    for code, by_options in list(cache.items()):
        if not isinstance(code, types.CodeType) or code.co_filename not in modules:
            continue  # the job's own program, generated code
        for options in by_options:
            entries.append(
                {
                    "file": code.co_filename,
                    "line": code.co_firstlineno,
                    "name": code.co_name,
                    "options": _options_fields(options),
                }
            )
    path.write_text(json.dumps(entries[:MAX_ENTRIES]))
    return len(entries)


def replay(entries: list[dict[str, Any]]) -> tuple[int, int]:
    """Convert the functions ``entries`` name; returns (converted, skipped)."""
    from tensorflow.python.autograph.core import converter

    transpiler = _transpiler()
    modules = _modules_by_file()
    index: dict[str, dict[tuple[int, str], types.CodeType]] = {}
    done = skipped = 0
    for entry in entries:
        try:
            module = modules[entry["file"]]
            codes = index.setdefault(entry["file"], _codes_of(module))
            code = codes[(entry["line"], entry["name"])]
            recursive, user_requested, convert_user, features = entry["options"]
            options = converter.ConversionOptions(
                recursive=recursive,
                user_requested=user_requested,
                internal_convert_user_code=convert_user,
                optional_features=[converter.Feature[name] for name in features],
            )
            function = types.FunctionType(
                code,
                module.__dict__,
                code.co_name,
                None,
                tuple(types.CellType(None) for _ in code.co_freevars),
            )
            transpiler.transform(function, converter.ProgramContext(options))
            done += 1
        except Exception as exc:  # a library's internals: anything can be missing
            log.debug("not warmed: %s (%s)", entry, exc)
            skipped += 1
    return done, skipped


def _options_fields(options: Any) -> list[Any]:
    return [
        options.recursive,
        options.user_requested,
        options.internal_convert_user_code,
        sorted(feature.name for feature in options.optional_features),
    ]


def _modules_by_file() -> dict[str, types.ModuleType]:
    found = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".py"):
            found[path] = module
    return found


def _codes_of(module: types.ModuleType) -> dict[tuple[int, str], types.CodeType]:
    """Every code object defined in ``module`` (functions, methods, nested ones)."""
    codes: dict[tuple[int, str], types.CodeType] = {}
    seen: set[int] = set()

    def add(code: types.CodeType) -> None:
        if code.co_filename != module.__file__ or id(code) in seen:
            return
        seen.add(id(code))
        codes[(code.co_firstlineno, code.co_name)] = code
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                add(const)

    def visit(obj: Any, depth: int) -> None:
        with contextlib.suppress(Exception):
            obj = inspect.unwrap(obj)
        if isinstance(obj, staticmethod | classmethod):
            obj = obj.__func__
        if isinstance(obj, property):
            for part in (obj.fget, obj.fset, obj.fdel):
                if part is not None:
                    visit(part, depth)
        elif isinstance(obj, types.FunctionType):
            add(obj.__code__)
            for cell in (obj.__closure__ or ()) if depth < 3 else ():
                with contextlib.suppress(ValueError):  # an empty cell
                    visit(cell.cell_contents, depth + 1)  # what a decorator wraps
        elif isinstance(obj, type) and depth < 3 and obj.__module__ == module.__name__:
            for value in list(vars(obj).values()):
                visit(value, depth + 1)

    for value in list(vars(module).values()):
        visit(value, 0)
    return codes
