"""The pi harness: one pi process per run over its RPC mode, settle detection, stops and
deadlines, and the continuation checkpoint step (``execute_run``)."""
