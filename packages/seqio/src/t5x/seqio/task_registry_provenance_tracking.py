"""``seqio.task_registry_provenance_tracking``: where each task or mixture was registered.

Registrations usually run at import time of some task module, which makes
"where does this task come from?" hard to answer. Once ``turn_on_tracking()``
is called, every ``TaskRegistry.add_provider`` / ``MixtureRegistry.add_provider``
(``add`` included) records the provider's class name and the first few
``file.py:line`` call sites outside the registry code; ``view_provenances()``
returns them by name.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterator
from types import FrameType
from typing import Any

# How many informative call sites to keep per registration (walking frames costs time).
_MAX_NUM_FRAMES_TO_CAPTURE_FOR_PROVENANCE = 5

# None: tracking off. Otherwise provider name -> (provider class name, call sites).
_PROVIDER_PROVENANCE_LOOKUP: dict[str, tuple[str, list[str]]] | None = None

# Frames in these files are the registry's own machinery, not the user's call site.
_MACHINERY = (
    "seqio/dataset_providers.py",
    "t5x/tasks/_registry.py",
    "t5/data/dataset_providers.py",
    "seqio/task_registry_provenance_tracking.py",
    "importlib",
    "embedded module",
)


def turn_on_tracking() -> None:
    """Starts recording registrations (forgetting any recorded before)."""
    global _PROVIDER_PROVENANCE_LOOKUP
    _PROVIDER_PROVENANCE_LOOKUP = {}


def registration_provenance_tracking_is_on() -> bool:
    return _PROVIDER_PROVENANCE_LOOKUP is not None


def maybe_record_provenance(frame: FrameType | None, name: str, provider: Any = None) -> None:
    """Records ``name``'s provider class and call sites, when tracking is on."""
    if _PROVIDER_PROVENANCE_LOOKUP is not None:
        kind = type(provider).__name__ if provider is not None else ""
        _PROVIDER_PROVENANCE_LOOKUP[name] = (kind, informative_upstream_callsites_from_frame(frame))


def _frames_outward(frame: FrameType | None) -> Iterator[FrameType]:
    while frame is not None:
        yield frame
        frame = frame.f_back


def _is_informative(frame: FrameType) -> bool:
    filename = frame.f_code.co_filename.replace("\\", "/")
    return not any(part in filename for part in _MACHINERY)


def _location(frame: FrameType) -> str:
    module = inspect.getmodule(frame)
    filename = getattr(module, "__file__", None) if module is not None else None
    if not filename:
        raise ValueError(
            f"Expected to get the module of the frame {frame=} {frame.f_code.co_filename=}, "
            "but was unable to do so."
        )
    return f"{filename}:{frame.f_lineno}"


def informative_upstream_callsites_from_frame(
    cur_frame: FrameType | None, max_num_frames: int = _MAX_NUM_FRAMES_TO_CAPTURE_FOR_PROVENANCE
) -> list[str]:
    """``file.py:line`` of up to ``max_num_frames`` frames from ``cur_frame`` outward, registry code skipped."""
    frames = itertools.islice(filter(_is_informative, _frames_outward(cur_frame)), max_num_frames)
    return [_location(f) for f in frames]


def view_provenances() -> dict[str, tuple[str, list[str]]]:
    """A copy of what was recorded: name -> (provider class name, call sites); empty when off."""
    return dict(_PROVIDER_PROVENANCE_LOOKUP) if _PROVIDER_PROVENANCE_LOOKUP is not None else {}


__all__ = [
    "informative_upstream_callsites_from_frame",
    "maybe_record_provenance",
    "registration_provenance_tracking_is_on",
    "turn_on_tracking",
    "view_provenances",
]
