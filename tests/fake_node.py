#!/usr/bin/env python3
"""Stands in for node in front of ``fake_pi.py``: takes node's ``--import MODULE`` options (the
harness preloads its gate, ``extension/gate.ts``), keeps the gate's contract (wait for one byte
on ``TETHER_GATE_FD``; end of file ends with status 75), then runs the script."""

import os
import sys

args = sys.argv[1:]
while args[:1] == ["--import"]:
    args = args[2:]
gate = os.environ.pop("TETHER_GATE_FD", None)
if gate is not None:
    released = os.read(int(gate), 1)
    os.close(int(gate))
    if not released:
        sys.exit(75)
os.execv(sys.executable, [sys.executable, *args])
