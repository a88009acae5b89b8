"""What the kernel, the supervisor and the workers agree on: the job's description
(:mod:`.spec`), process identity, environment names and control requests
(:mod:`.process`), what state.json says (:mod:`.status`), the job directory on disk and
finding jobs (:mod:`.store`), files only this user may touch (:mod:`.private`), the
control and metrics channels (:mod:`.control`, :mod:`.metrics`), reading files that
grow (:mod:`.tail`) and the checks on a cell body that the client and the backends
share (:mod:`.cellcheck`)."""

from typing import Any


def __getattr__(name: str) -> Any:
    """The names of the old ``jupyter_distrain.contract`` module (now :mod:`.process`),
    kept for one release."""
    import importlib

    process = importlib.import_module(f"{__name__}.process")
    try:
        return getattr(process, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
