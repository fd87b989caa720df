"""The harness and the continuation extension agree (tether.pi.continuation is the source): the
compiled extension, loaded in the Node that runs pi, exports the same marker tag and version,
receipt kind, presence command and refusal reasons; it takes the harness's markers as its own,
and the harness reads the receipts it sends."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tether.harness.checkpoint import EXTENSION_PATH, marker, parse_receipt
from tether.ledger import ReceiptReason
from tether.pi import continuation
from tether.pi.install import find_pi
from tether.pi.protocol import Event, UiMethod

_SCRIPT = """
const m = await import(process.env.TETHER_EXTENSION_URL);
const markers = JSON.parse(process.env.TETHER_MARKERS);
const receipts = [];
const env = { [m.NONCE_ENV]: "the-nonce", OTHER: "kept" };
const ctx = { ui: { notify: (message, type) => receipts.push({ message, type }) } };
for (const reason of m.REFUSAL_REASONS) m.refuse(ctx, "r-7", reason);
process.stdout.write(JSON.stringify({
  MARKER_TAG: m.MARKER_TAG,
  MARKER_VERSION: m.MARKER_VERSION,
  RECEIPT_KIND: m.RECEIPT_KIND,
  PRESENCE_COMMAND: m.PRESENCE_COMMAND,
  PRESENCE_KIND: m.PRESENCE_KIND,
  REFUSAL_REASONS: m.REFUSAL_REASONS,
  NONCE_ENV: m.NONCE_ENV,
  MAC_FIELD: m.MAC_FIELD,
  MAC_DOMAIN: m.MAC_DOMAIN,
  parsed: markers.map((text) => m.parseMarker(text)),
  receipts,
  mac: m.checkpointMac(process.env.NONCE, "r-9", process.env.SUMMARY),
  taken: m.takeNonce(env),
  left: env,
}));
"""

RETRY = {"max_retries": 2, "base_delay_ms": 500, "max_delay_ms": 9000}
NONCE = continuation.new_nonce()
SUMMARY = "## Goal\nCount to 2000 \u2028 \u00e9t\u00e9 \U0001f600, then stop."


@pytest.fixture(scope="module")
def extension() -> dict[str, Any]:
    """What the compiled extension (the module pi loads) exports and does, read in Node."""
    markers = [
        marker("r-1", max_bytes=600, retry=None),
        marker("r-2", max_bytes=9, retry=RETRY),
        # a version this harness does not write: the extension must refuse it, not run it
        marker("r-3", max_bytes=600, retry=None).replace(
            f'"version":{continuation.MARKER_VERSION}',
            f'"version":{continuation.MARKER_VERSION + 1}',
        ),
    ]
    done = subprocess.run(
        [str(find_pi().node), "--input-type=module", "-e", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            "TETHER_EXTENSION_URL": EXTENSION_PATH.resolve().as_uri(),
            "TETHER_MARKERS": json.dumps(markers),
            "NONCE": NONCE,
            "SUMMARY": SUMMARY,
        },
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("name", continuation.__all__)
def test_the_extension_writes_the_same_value(extension: dict[str, Any], name: str) -> None:
    assert extension[name] == getattr(continuation, name), (
        f"extension/continuation.ts has {name} = {extension[name]!r}, tether.pi.continuation "
        f"{getattr(continuation, name)!r}: change the TypeScript to match and run make extension"
    )


def test_the_refusal_reasons_are_the_ledgers_closed_set(extension: dict[str, Any]) -> None:
    assert extension["REFUSAL_REASONS"] == [r.value for r in ReceiptReason]


def test_the_extension_takes_the_harness_markers(extension: dict[str, Any]) -> None:
    ours, retried, newer = extension["parsed"]
    # A marker without anchors_max_bytes (none asked for) parses as 0: no anchors stored.
    assert ours == {"kind": "ours", "marker": {"run": "r-1", "maxBytes": 600, "anchorsMaxBytes": 0}}
    assert retried["kind"] == "ours"
    assert retried["marker"]["retry"] == {
        "enabled": True,
        "maxRetries": 2,
        "baseDelayMs": 500,
        "maxAgentDelayMs": 9000,
    }
    assert newer == {"kind": "malformed", "run": "r-3"}


def test_the_harness_reads_every_receipt_the_extension_sends(extension: dict[str, Any]) -> None:
    read = [
        parse_receipt(
            {
                "type": Event.EXTENSION_UI_REQUEST.value,
                "id": "ui-1",
                "method": UiMethod.NOTIFY.value,
                "message": receipt["message"],
                "notifyType": receipt["type"],
            },
            "r-7",
        )
        for receipt in extension["receipts"]
    ]
    assert read == list(ReceiptReason)


def test_the_extension_signs_a_checkpoint_as_the_harness_checks_it(
    extension: dict[str, Any],
) -> None:
    """The proof in a checkpoint's marker: the same HMAC on both sides (non-ASCII summaries
    included), which :func:`proven` accepts for that run and summary only."""
    assert extension["mac"] == continuation.checkpoint_mac(NONCE, "r-9", SUMMARY)
    marker = {"version": 1, "run": "r-9", continuation.MAC_FIELD: extension["mac"]}
    assert continuation.proven(marker, nonce=NONCE, run="r-9", summary=SUMMARY)
    assert not continuation.proven(marker, nonce=NONCE, run="r-8", summary=SUMMARY)
    assert not continuation.proven(marker, nonce=NONCE, run="r-9", summary=SUMMARY + " ")
    assert not continuation.proven(marker, nonce=NONCE + "x", run="r-9", summary=SUMMARY)
    assert not continuation.proven(
        {"version": 1, "run": "r-9"}, nonce=NONCE, run="r-9", summary=SUMMARY
    )


def test_the_extension_takes_the_nonce_out_of_the_environment(extension: dict[str, Any]) -> None:
    assert extension["taken"] == "the-nonce"
    assert extension["left"] == {"OTHER": "kept"}
