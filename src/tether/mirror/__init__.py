"""The mirror: pi session entries become ledger rows through fenced writes, idempotent by pi
entry id."""
