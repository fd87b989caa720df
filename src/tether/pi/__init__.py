"""Speaking to pi: nothing here knows about runs or the ledger (docs/architecture.md,
docs/operations.md#upgrading-pi).

Bottom up: ``jsonl`` (framing on ``\\n`` only), ``protocol`` (pi's command, event and stop-reason
names, one for one), ``transport`` (the ``AgentTransport`` seam; pi as a child process),
``client`` (the async RPC client), ``install`` (finding the pinned pi and Node 22, pi's command
line and environment), ``agentdir`` and ``sessionfile`` (what a run's pi reads at start),
``keys`` and ``toolchannel`` (what reaches pi beside its environment), ``gate`` and ``launch``
(pi started ahead of its run, held until the run is ready), ``keeper`` and ``detached`` (pi
under a keeper, so a run outlives its harness).

Import the modules themselves (``from tether.pi.client import RpcClient``): this package
re-exports nothing, so that starting pi early (``tether.pi.launch``) loads no more than it needs.
"""
