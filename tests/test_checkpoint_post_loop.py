"""Post-loop task turns (docs/contracts.md#compaction-rows: "the same mechanism covers post-loop
task turns"): a
follow-up delivered into the live pi (the relay's ``follow_up``) runs as a turn after pi's
loop would have ended; the checkpoint waits for it to settle and covers it. The real pi, the
scripted provider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from checkpoint_support import AGENT, BIG_COMMAND, SUMMARY, config, rows_of, wait_for
from provider import Reply, ToolCall, route
from tether.harness.checkpoint import EXTENSION_PATH, continuation_checkpoint
from tether.harness.relay import Deliver, LivePi
from tether.harness.run import RunRequest, execute_run
from tether.harness.turn import CheckpointStatus
from tether.ledger import Ledger, RowKind, open_ledger
from tether.mirror.entries import message_text

FOLLOW_UP = "Now count to 2000 as well."
FIRST = "FIRST ANSWER: the tree is clean."
LAST = "LAST ANSWER: counted to 2000 (after the follow-up)."


def test_a_follow_up_delivered_into_pi_is_settled_before_the_checkpoint_and_covered(
    scripted_provider: Any, tmp_path: Path
) -> None:
    provider = scripted_provider(
        route(
            task=[
                Reply(tool_calls=[ToolCall("bash", {"command": "sleep 1; echo clean"})]),
                Reply(FIRST),
                # pi's loop would end with FIRST: the follow-up is the turn after it, and only
                # its big tool result puts the working view over the budget.
                Reply(tool_calls=[ToolCall("bash", {"command": BIG_COMMAND})]),
                Reply(LAST),
            ],
            summary=[Reply(SUMMARY)],
        )
    )
    cfg = config(tmp_path, provider, budget=4000)
    ledger: Ledger = open_ledger(cfg.ledger.url)
    delivered: list[bool] = []

    async def relay(live: LivePi) -> None:
        await wait_for(lambda: len(provider.requests) >= 1)  # pi is in its first tool call
        delivered.append(await live.deliver(Deliver.FOLLOW_UP, FOLLOW_UP, "user:bo"))
        await anyio.sleep_forever()

    async def go() -> Any:
        workdir = tmp_path / "work"
        workdir.mkdir(exist_ok=True)
        return await execute_run(
            ledger,
            cfg,
            RunRequest(
                session="s1",
                agent=AGENT,
                text="Look at the tree.",
                actor="user:ana",
                workdir=workdir,
                extensions=(EXTENSION_PATH,),
            ),
            checkpoint=continuation_checkpoint,
            relay=relay,
        )

    try:
        outcome = anyio.run(go)
        assert delivered == [True]
        assert outcome.answer == LAST, outcome
        assert outcome.checkpoint.status is CheckpointStatus.WRITTEN, outcome
        rows = list(ledger.iter_rows("s1"))
        [follow_up] = [r for r in rows if r.role == "user" and message_text(r.body) == FOLLOW_UP]
        assert follow_up.actor == "user:bo"
        [last] = [r for r in rows if r.role == "assistant" and message_text(r.body) == LAST]
        [checkpoint] = rows_of(ledger, "s1", RowKind.COMPACTION)
        # Written after the post-loop turn settled, covering it to its last answer.
        assert checkpoint.seq > last.seq
        assert checkpoint.covers_to >= last.seq
        [summary_request] = provider.summary_requests
        assert summary_request.contains(FOLLOW_UP)
        assert summary_request.contains(LAST)
        # No task prompt beyond the run's own and the follow-up: four task requests.
        assert len(provider.task_requests) == 4
    finally:
        ledger.close()
