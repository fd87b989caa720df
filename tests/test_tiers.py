"""The unit tier's sizes (tests/support/tier.py): full in ``make test``, smaller in
``make test-fast``, never larger."""

from __future__ import annotations

import pytest

from support import tier


@pytest.mark.parametrize(("unit_tier", "expected"), [(False, 300), (True, 60)])
def test_examples_are_the_full_count_unless_in_the_unit_tier(
    monkeypatch: pytest.MonkeyPatch, unit_tier: bool, expected: int
) -> None:
    monkeypatch.setattr(tier, "UNIT_TIER", unit_tier)
    assert tier.examples(300, unit=60) == expected


def test_a_unit_count_above_the_full_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unit tier's count \(61\) must not exceed the full one"):
        tier.examples(60, unit=61)
