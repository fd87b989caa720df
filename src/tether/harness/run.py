"""One run of an agent on a session: request → pi → mirror → answer (docs/cli.md#tether-run). The
entry
points; each step lives in a room of its own (see the end of this docstring).

    outcome = await execute_run(ledger, config, RunRequest(session="s1", agent="reviewer",
                                                           text="Review the diff"))

The lifecycle:

1. Check the configuration (the agent, its provider, the provider's key) and find pi: nothing is
   written when any of them is wrong.
2. Build the follow-up view when the session has history (a refusal writes nothing).
3. Create and claim the run; write the view's copied rows and the request row (fenced).
4. Give the run its own directory: pi agent dir (``models.json``, ``settings.json``), the
   session file written from the view, pi's stderr log.
5. The task turn: start pi, send one ``prompt``, follow events until ``agent_settled``
   (``agent_end`` is not the end: retries, overflow recovery and queued work follow it),
   mirroring entries as they land. It ends with a value (:data:`TaskEnd`): pi settled, pi
   failed, or a stop.
6. After a settled, successful task turn, the checkpoint step (one awaited call; see
   :class:`SettledTurn`) may run while events are still read and stops still apply.
7. Close pi (orderly, escalating), mirror what is left, and end the run with the verdict drawn
   from those values (:func:`tether.harness.turn.verdict`).

Stops are scopes (:mod:`tether.harness.stops`): the deadline (``deadline_s`` of the agent, on the
injected ``Clock``) and a soft stop cancel the turn's soft scope, after which ``abort`` is sent
and pi has ``harness.stop_grace_s`` to settle; if it does not, the stop escalates to the hard
scope, pi is killed and the session refuses prompts until an operator clears it, because pi's
idle was never confirmed (invariant 15). A hard stop kills pi's process group at once, also
while pi is being closed. Whatever answer exists is kept in every outcome (invariant 14).

The rooms: ``queue`` (admission, queueing, reconcile on touch: :func:`execute_run`),
``claimed`` (a claimed run started: :func:`run_claimed`), ``prepare`` (the view's copies, the
request row, pi's session file, the custody state), ``driver`` (pi's three openings, the task
turn, the checkpoint), ``helpers`` (the tasks beside the turn), ``storage`` (the storage-retry
policy), ``ending`` (the verdict, the end record, the outcome).
"""

from __future__ import annotations

from tether.harness.claimed import run_claimed
from tether.harness.queue import execute_run
from tether.harness.rundir import runs_dir
from tether.harness.turn import (
    NOT_NEEDED,
    CheckpointResult,
    CheckpointStatus,
    CheckpointStep,
    RunOutcome,
    RunRequest,
    SettledTurn,
)
from tether.threads import in_thread

__all__ = [
    "NOT_NEEDED",
    "CheckpointResult",
    "CheckpointStatus",
    "CheckpointStep",
    "RunOutcome",
    "RunRequest",
    "SettledTurn",
    "execute_run",
    "in_thread",
    "run_claimed",
    "runs_dir",
]
