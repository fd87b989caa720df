"""The resume protocol (docs/architecture.md#custody, invariants 15-17), in one place.

- ``state``: what a harness taking a run over needs (:class:`~.state.CustodyState`), written
  by the driver into the run directory before pi is let through;
- ``markers``: ``prompt.sent`` / ``compact.sent``, written before either command reaches pi, so
  a takeover never prompts again nor sends the summary command twice;
- ``placement``: where a live run is held (host, harness, pi and its keeper);
- ``recovery``: the checkpoint a lost harness sent, waited for and never resent;
- ``owner``: whether a newer owner holds the run (asked before anything stops pi);
- ``reconcile``: lapsed leases, resumed, ended ``harness_lost`` or ``unconfirmed_ending``.

Import the module you need (``from tether.harness.custody.reconcile import reconcile``): this
package imports none of them, so that the driver can use ``state``, ``markers``, ``placement``,
``owner`` and ``recovery`` while ``reconcile`` uses the driver, with no circle.
"""
