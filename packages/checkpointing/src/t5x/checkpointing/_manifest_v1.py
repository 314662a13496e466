"""Version 1 checksum manifests, read as version 2.

Version 1 recorded every array's whole ``.zarray`` (``"zarray": {...}``) and
the digest of its file (``"zarray_digest"``, which no reader uses). Version 2
records point at shared bodies instead; this turns the first form into the
second, so readers handle one form only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def as_version_2(arrays: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Version 1's array records as version 2's records and shared bodies.

    A record whose ``.zarray`` is not an object with ``shape`` and ``chunks``
    keeps no body index, which the array's check reports, naming the parameter.

    Returns:
      ``(records, bodies)``.
    """
    bodies: list[dict[str, Any]] = []
    by_text: dict[str, int] = {}
    records: dict[str, Any] = {}
    for folder, record in arrays.items():
        zarray = record.get("zarray") if isinstance(record, dict) else None
        if not isinstance(zarray, dict) or "shape" not in zarray or "chunks" not in zarray:
            records[folder] = {"chunks": record.get("chunks")} if isinstance(record, dict) else record
            continue
        body = {key: value for key, value in zarray.items() if key not in ("shape", "chunks")}
        text = json.dumps(body, sort_keys=True)
        index = by_text.get(text)
        if index is None:
            index = by_text[text] = len(bodies)
            bodies.append(body)
        records[folder] = {
            "zarray": index,
            "shape": zarray["shape"],
            "chunk_shape": zarray["chunks"],
            "chunks": record.get("chunks"),
        }
    return records, bodies
