"""XLA flags the launcher sets before JAX starts its backend: CPU defaults and a config's own."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

# Options of XLA:CPU's own (``--xla_backend_extra_options=key=value``). XLA:CPU compiles a
# while loop that its cost model rates below this many bytes into one single-threaded
# kernel, without its thunks' threaded and library-backed matmuls. A decoding loop rates
# below the 1 kB default although every step reads all the weights; at batch 1 its matmuls
# then ran up to 2x slower (greedy DEC-S: 66 -> 77 generated tokens/s with the pass off,
# ENCDEC-S: 109 -> 123; batch 8 was not affected).
BACKEND_DEFAULTS = {"xla_cpu_small_while_loop_byte_threshold": "0"}

# The gin macro a config names its own XLA flags with, e.g. the demo's
# ``XLA_FLAGS = ['--xla_cpu_experimental_ynn_fusion_type=']`` (runs/demo.gin).
CONFIG_MACRO = "XLA_FLAGS"


def _append_missing(environ: MutableMapping[str, str], flags: dict[str, str]) -> None:
    """Appends each of ``flags``' values to ``XLA_FLAGS`` whose key does not appear there yet."""
    current = environ.get("XLA_FLAGS", "")
    added = [flag for probe, flag in flags.items() if probe not in current]
    if added:
        environ["XLA_FLAGS"] = " ".join(filter(None, [current, *added]))


def add_backend_defaults(environ: MutableMapping[str, str]) -> None:
    """Appends each of ``BACKEND_DEFAULTS`` to ``environ["XLA_FLAGS"]`` unless the user set it.

    XLA merges repeated ``--xla_backend_extra_options`` flags, so a user's other options
    stay as they are. Library users who decode outside ``t5x-launch`` call this before JAX
    starts its backend.
    """
    _append_missing(
        environ, {f"{k}=": f"--xla_backend_extra_options={k}={v}" for k, v in BACKEND_DEFAULTS.items()}
    )


def add_xla_defaults(environ: MutableMapping[str, str]) -> None:
    """Appends the XLA:CPU defaults of a ``t5x-launch`` CPU job to ``environ["XLA_FLAGS"]``.

    Today these are :data:`BACKEND_DEFAULTS` (:func:`add_backend_defaults`); each keeps the
    user's value where set. Takes effect only for a JAX backend that has not started yet
    (XLA reads the flags once, when the backend is created).
    """
    add_backend_defaults(environ)


def add_config_flags(environ: MutableMapping[str, str], flags: object, where: str = CONFIG_MACRO) -> None:
    """Appends a config's XLA flags (``--name=value`` strings) unless the user set the same name.

    Args:
      environ: the job's environment, before JAX starts its backend.
      flags: a list or tuple of ``--xla_...=value`` strings.
      where: what set ``flags``, for the error message.

    Raises:
      ValueError: when ``flags`` is not a sequence of ``--name=value`` strings.
    """
    if isinstance(flags, str) or not isinstance(flags, Sequence):
        raise ValueError(
            f"{where} must be a list of XLA flags like ['--xla_name=value'], got {type(flags).__name__} {flags!r}"
        )
    named = {}
    for flag in flags:
        if not isinstance(flag, str) or not flag.startswith("--") or "=" not in flag:
            raise ValueError(f"{where}: each XLA flag must be a string '--name=value', got {flag!r}")
        named[flag.split("=", 1)[0] + "="] = flag
    _append_missing(environ, named)


def add_gin_flags(environ: MutableMapping[str, str]) -> None:
    """Appends the parsed gin config's ``XLA_FLAGS`` macro (if it sets one) with :func:`add_config_flags`.

    Raises:
      GinConfigError: when the macro is not a list of ``--name=value`` strings.
    """
    import gin

    from t5x.launch._gin_config import GinConfigError, macro_value

    flags = macro_value(CONFIG_MACRO)
    if flags is gin.REQUIRED:
        return
    try:
        add_config_flags(environ, flags, f"the gin macro {CONFIG_MACRO}")
    except ValueError as error:
        raise GinConfigError(str(error)) from None
