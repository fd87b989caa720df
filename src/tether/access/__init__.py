"""Admission: which source obligations an actor may read (``[access.grants]`` in tether.toml).

Summary text never grants anything: admission looks only at the ``sources`` a row carries.
"""

from __future__ import annotations

from tether.access.grants import Admission, matches
from tether.access.obligations import Obligations

__all__ = ["Admission", "Obligations", "matches"]
