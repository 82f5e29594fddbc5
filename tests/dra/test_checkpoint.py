"""The prepared-claims record survives a round trip, refuses what it cannot read, and reads a
record written before devices kept their consumed slots as one slot each, and its claims as not
counted on the node."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.dra.checkpoint import BadCheckpoint, PreparedClaim, PreparedDevice, decode, encode

_TEXT = st.text(min_size=1, max_size=20)
DEVICES = st.builds(
    PreparedDevice,
    st.lists(_TEXT, max_size=3).map(tuple),
    _TEXT,
    _TEXT,
    st.lists(_TEXT, max_size=3).map(tuple),
    st.none() | _TEXT,
    st.integers(1, 100),
)
CLAIMS = st.builds(
    PreparedClaim, _TEXT, _TEXT, st.lists(DEVICES, max_size=3).map(tuple), _TEXT, st.booleans()
)


@given(st.dictionaries(_TEXT, CLAIMS, max_size=5))
def test_round_trip(claims: dict[str, PreparedClaim]) -> None:
    assert decode(encode(claims)) == claims


@pytest.mark.parametrize(
    "text", ["", "[]", '{"version": 2, "claims": {}}', '{"version": 1, "claims": {"u": {}}}']
)
def test_unreadable_records_are_errors_not_empty(text: str) -> None:
    with pytest.raises(BadCheckpoint):
        decode(text)


def test_a_device_without_its_slots_holds_one() -> None:
    text = encode({"u": PreparedClaim("ns", "c", (PreparedDevice(("r",), "p", "d", ()),), "f")})
    old = text.replace('"slots": 1', '"old": 0')
    assert '"old"' in old
    assert decode(old)["u"].devices[0].slots == 1
    assert decode(text.replace('"counted": false', '"old": 0'))["u"].counted is False
