"""Where a device sits in the hardware grid, under upstream t5x's names."""

from __future__ import annotations

from typing import Any

import jax


def get_coords(device: Any) -> tuple[int, ...]:
    """A device's position: ``(x, y, z, core)`` on TPU, ``(process, local index)`` elsewhere.

    Non-TPU devices carry no coordinates; their local index is taken as ``id`` modulo the
    per-process device count, as upstream t5x does.
    """
    if hasattr(device, "coords"):
        return (*device.coords, device.core_on_chip)
    return (device.process_index, device.id % jax.local_device_count())


def bounds_from_last_device(last_device: Any) -> tuple[int, ...]:
    """The hardware grid's size, read from its last device (the one with the largest coordinates).

    On TPU: ``(x, y, z, cores)``, one past the device's coordinates. Elsewhere:
    ``(process count, devices per process)``.
    """
    if hasattr(last_device, "coords"):
        return (*(c + 1 for c in last_device.coords), last_device.core_on_chip + 1)
    return (jax.process_count(), jax.local_device_count())
