"""The jail pi and its tools run in (docs/security.md): bubblewrap, the provider forwarder outside
it, and the limits a run's processes get.

``bwrap`` builds the command that starts pi confined (checked for bubblewrap and user namespaces
first); ``outside`` is the small program that starts that command and serves the provider
forwarder beside it, outside the sandbox, holding the provider key. Nothing here knows about
runs, pi's protocol or the ledger: the pi package asks for a confinement and starts what it is
given.

Import the modules themselves (``from tether.sandbox.bwrap import Confinement``).
"""
