"""Where an import keeps what a row has no place for, so an export writes the entries back as
they were (what an entry stands for is :mod:`tether.pi.sessionformat`, shared with the mirror):

    PI_KEY     the fields of an entry its row does not hold (its ISO ``timestamp``, a
               compaction's ``systemMessage`` and ``usage`` …): in the row's extra
    BEFORE_KEY bookkeeping entries, kept whole in the extra of the next row
    AFTER_KEY  …or of the session, when no row follows
    HEADER_KEY the header (minus ``type`` and ``version``): in the session's extra

The ledger keeps extras on every round trip.

A pi file has no run records: an export writes each ended run as a ``custom`` entry of type
:data:`RUN_TYPE` (pi keeps it and leaves it out of the model's context) right after the run's
last row, and an import reads the runs back from them::

    {"type":"custom","id":…,"parentId":…,"timestamp":"<the run's end>","customType":"tether.run",
     "data":{"status":"finished","started":"…","ended":"…",
             "first":<entry id of its first row>,"last":<…of its last row>,"request":<…>}}
"""

from __future__ import annotations

__all__ = ["AFTER_KEY", "BEFORE_KEY", "HEADER_KEY", "PI_KEY", "RUN_TYPE"]

PI_KEY = "pi"
BEFORE_KEY = "pi_before"
AFTER_KEY = "pi_after"
HEADER_KEY = "pi_header"
RUN_TYPE = "tether.run"
"""The ``customType`` of the entries that carry run records through a pi file."""
