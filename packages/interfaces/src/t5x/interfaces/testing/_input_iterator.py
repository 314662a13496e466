"""Conformance check for the InputIterator contract."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import numpy as np

from t5x.interfaces._input_iterator import InputIterator
from t5x.interfaces._values import ArraySpec
from t5x.interfaces.testing._common import require, require_members

MAX_STATE_BYTES = 64 * 1024


def check_input_iterator(
    make_iterator: Callable[[], InputIterator], *, num_batches: int = 3, resume_batches: int = 3
) -> None:
    """Checks iterators from ``make_iterator`` against the InputIterator contract.

    Reads ``num_batches``, saves the state, reads ``resume_batches`` more; then a
    fresh iterator restored to the state must yield the same ``resume_batches``.
    The data behind ``make_iterator`` needs ``num_batches + resume_batches``
    batches at least.

    Raises:
      ConformanceError: naming the broken rule.
    """
    first = make_iterator()
    require_members(first, InputIterator)
    require(iter(first) is first, "__iter__ must return the iterator itself")
    spec = first.element_spec
    for _ in range(num_batches):
        _check_batch(next(first), spec)
    state = first.get_state()
    encoded = json.dumps(state)
    require(json.loads(encoded) == state, "get_state() must survive a JSON round trip unchanged")
    require(
        len(encoded) <= MAX_STATE_BYTES,
        f"the state is {len(encoded)} bytes as JSON; at most {MAX_STATE_BYTES}",
    )
    expected = [next(first) for _ in range(resume_batches)]

    resumed = make_iterator()
    resumed.set_state(json.loads(encoded))
    for index, want in enumerate(expected):
        got = next(resumed)
        require(
            got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want),
            f"batch {index} after set_state differs from the uninterrupted iterator's",
        )


def _check_batch(batch: Mapping[str, np.ndarray], spec: Mapping[str, ArraySpec]) -> None:
    require(isinstance(batch, dict), f"a batch must be a dict, got {type(batch).__name__}")
    require(
        set(batch) == set(spec), f"batch features {sorted(batch)} differ from element_spec {sorted(spec)}"
    )
    for name, array in batch.items():
        require(
            isinstance(array, np.ndarray),
            f"feature {name!r} must be a numpy array, got {type(array).__name__}",
        )
        want = spec[name]
        shape, dtype = want.shape, want.dtype
        require(
            str(array.dtype) == str(dtype),
            f"feature {name!r} has dtype {array.dtype}, element_spec says {dtype}",
        )
        require(
            len(array.shape) == len(shape)
            and all(s is None or s == a for s, a in zip(shape, array.shape, strict=True)),
            f"feature {name!r} has shape {array.shape}, element_spec says {shape}",
        )
