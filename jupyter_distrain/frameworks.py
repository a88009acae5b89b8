"""What TensorFlow, Keras and Horovod are installed, read from package metadata (nothing
is imported: a kernel must not pay for TensorFlow to submit a job)."""

from __future__ import annotations

import importlib.metadata
import importlib.util

LEGACY_KERAS_FROM = (2, 16)  # from here on tf.keras is Keras 3 unless TF_USE_LEGACY_KERAS=1
HOROVOD_BUILDS_UP_TO = (2, 18)  # Horovod 0.28.1, its last release, fails to build after


def installed_version(*distributions: str) -> str | None:
    """The version string of the first of these distributions that is installed."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def importable(module: str, install_hint: str) -> tuple[bool, str]:
    """Whether ``module`` can be imported here (found, not imported: that can take
    seconds), and why: its installed version, or ``install_hint``."""
    if importlib.util.find_spec(module) is None:
        return False, install_hint
    version = installed_version(module)
    return True, f"{module} {version} is installed" if version else f"{module} is installed"


def version_of(*distributions: str) -> tuple[int, int] | None:
    """(major, minor) of the first of these distributions that is installed."""
    for name in distributions:
        text = installed_version(name)
        if text is None:
            continue
        major, _, rest = text.partition(".")
        minor = rest.split(".")[0]
        if major.isdigit() and minor.isdigit():
            return int(major), int(minor)
    return None


TENSORFLOW_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tensorflow-gpu", "tf-nightly")


def tensorflow_version() -> tuple[int, int] | None:
    return version_of(*TENSORFLOW_DISTRIBUTIONS)


def horovod_missing_reason() -> str:
    """Why Horovod is not installed, with what to use instead."""
    tf = tensorflow_version()
    instead = "use --backend tf (MultiWorkerMirroredStrategy) or --ps N (parameter servers)"
    if tf is not None and tf > HOROVOD_BUILDS_UP_TO:
        return (
            f"horovod is not installed: its last release (0.28.1) does not build against "
            f"TensorFlow {tf[0]}.{tf[1]} (2.18 at most); {instead}"
        )
    return f"horovod is not installed (`make setup` builds it); {instead}"


def resolve_keras(choice: str) -> tuple[str, str]:
    """``--keras auto|legacy|native`` -> (what workers use, why; "" when nothing to say).

    From TensorFlow 2.16 ``tf.keras`` is Keras 3, whose ``fit`` cannot run under
    MultiWorkerMirroredStrategy or ParameterServerStrategy; with ``tf-keras``
    installed, workers use it instead (``TF_USE_LEGACY_KERAS=1``)."""
    tf = tensorflow_version()
    if tf is None or tf < LEGACY_KERAS_FROM:
        return "native", ""  # Keras 2 is tf.keras: nothing to choose
    legacy_there = importlib.util.find_spec("tf_keras") is not None
    if choice == "legacy" and not legacy_there:
        return "native", "--keras legacy: tf-keras is not installed (pip install tf-keras)"
    if choice == "native":
        return "native", ""
    if legacy_there:
        why = (
            ""
            if choice == "legacy"
            else (
                f"Keras: legacy tf-keras (TensorFlow {tf[0]}.{tf[1]}'s Keras 3 cannot run "
                "these strategies' fit; --keras native to use Keras 3, --backend jax for "
                "Keras 3 on many processes)"
            )
        )
        return "legacy", why
    return "native", (
        f"Keras 3 (TensorFlow {tf[0]}.{tf[1]}): its fit cannot run under "
        "MultiWorkerMirroredStrategy or ParameterServerStrategy; pip install tf-keras, "
        "or run Keras 3 on JAX (--backend jax)"
    )
