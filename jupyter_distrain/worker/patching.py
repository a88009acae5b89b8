"""Patching a library right after it is imported, without importing it ourselves first
(a worker must not pay for TensorFlow unless the program imports it)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after module ``name`` has been executed."""

    def __init__(self, name: str, patch: Callable[[Any], None]):
        self.name, self.patch = name, patch

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # once is enough
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return None
        loader, patch = spec.loader, self.patch
        original_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            original_exec(module)
            patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def patch_on_import(name: str, patch: Callable[[Any], None]) -> None:
    """Apply ``patch`` to module ``name`` now if it is loaded, else when it is."""
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _PatchOnImport(name, patch))
