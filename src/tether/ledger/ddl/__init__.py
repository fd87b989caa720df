"""The ledger's DDL, one module per engine: the migrations each engine's ledger replays, in
order, from an empty database to :data:`SCHEMA_VERSION` (append, never edit)."""
