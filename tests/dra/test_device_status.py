"""A claim's `status.devices` entries for brokerInfo (pure): this node's keys replace only its
own, other nodes' stay, nothing goes to a device that is not allocated, and a device's `data`
never passes the API server's 10 KiB, counted as the API server stores it."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from akri_trio import dra
from akri_trio.dra.device_status import (
    DATA_MAX_BYTES,
    DeviceKey,
    apply_body,
    fit,
    plan,
    reported,
    stored_json_size,
)

POOL = "node/n1/ns"
DEV = DeviceKey(POOL, "cam-aaaaaa")


def _claim(*results: DeviceKey, devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    allocation = {
        "devices": {
            "results": [
                {"request": "r", "driver": dra.DRIVER, "pool": k.pool, "device": k.device}
                | ({"shareID": k.share_id} if k.share_id else {})
                for k in results
            ]
        }
    }
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
        "status": {"allocation": allocation, "devices": devices or []},
    }


def _entry(key: DeviceKey, info: dict[str, str], driver: str = dra.DRIVER) -> dict[str, Any]:
    return {"driver": driver, "pool": key.pool, "device": key.device, "data": {"brokerInfo": info}}


def test_a_node_s_files_become_its_device_s_data() -> None:
    status = plan("n1", _claim(DEV), {DEV: {"n1/firmware": "1.2.3"}})
    assert status.devices == (_entry(DEV, {"n1/firmware": "1.2.3"}),)
    assert not status.unchanged and not status.problems


def test_another_node_s_keys_stay_and_only_this_node_s_are_replaced() -> None:
    held = _entry(DEV, {"n2/firmware": "9", "n1/old": "x"})
    status = plan("n1", _claim(DEV, devices=[held]), {DEV: {"n1/new": "y"}})
    assert status.devices == (_entry(DEV, {"n1/new": "y", "n2/firmware": "9"}),)
    # Nothing of this node's: its keys go, the other node's stay.
    status = plan("n1", _claim(DEV, devices=[held]), {})
    assert status.devices == (_entry(DEV, {"n2/firmware": "9"}),)


def test_an_entry_left_empty_is_left_out_and_the_same_again_is_unchanged() -> None:
    claim = _claim(DEV, devices=[_entry(DEV, {"n1/a": "1"})])
    assert plan("n1", claim, {}).devices == ()
    assert plan("n1", claim, {DEV: {"n1/a": "1"}}).unchanged


def test_other_drivers_entries_and_unallocated_devices_get_nothing() -> None:
    gone = DeviceKey(POOL, "cam-bbbbbb")
    foreign = _entry(DEV, {"x": "y"}, driver="gpu.example.com")
    status = plan("n1", _claim(DEV, devices=[foreign]), {DEV: {"n1/a": "1"}, gone: {"n1/b": "2"}})
    assert status.devices == (_entry(DEV, {"n1/a": "1"}),)
    assert reported(_claim(DEV, devices=[foreign])) == {}


def test_a_shared_device_s_entry_carries_its_share_id() -> None:
    shared = DeviceKey(POOL, "cam-aaaaaa", "4b9d6f2e-1c3a-4e5f-8a7b-9c0d1e2f3a4b")
    (entry,) = plan("n1", _claim(shared), {shared: {"n1/a": "1"}}).devices
    assert entry["shareID"] == shared.share_id


def test_files_past_the_data_limit_are_left_out_whole_and_reported() -> None:
    files = {f"n1/f{i}": "<" * 1000 for i in range(3)}  # each '<' stored as \u003c
    status = plan("n1", _claim(DEV), {DEV: files})
    (entry,) = status.devices
    assert list(entry["data"]["brokerInfo"]) == ["n1/f0"]
    assert status.problems == {
        DEV: (
            f"'f1': over {DATA_MAX_BYTES} bytes of claim status data",
            f"'f2': over {DATA_MAX_BYTES} bytes of claim status data",
        )
    }


@given(st.dictionaries(st.text(max_size=5), st.text(max_size=40), max_size=6))
def test_the_size_bound_is_at_least_go_s_encoding(value: dict[str, str]) -> None:
    """Go's encoding/json (1.22+) escapes control characters as Python does, keeps other UTF-8
    as is, and escapes <, > and & (and U+2028/9) as \\uXXXX: never more bytes than the bound."""
    go = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for c in "<>&\u2028\u2029":
        go = go.replace(c, f"\\u{ord(c):04x}")
    assert len(go.encode()) <= stored_json_size(value)


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=3000), max_size=8))
def test_what_fits_stays_within_the_limit_and_the_rest_is_reported(files: dict[str, str]) -> None:
    entries = {f"n1/{k}": v for k, v in files.items()}
    kept, problems = fit(entries, {"n2/x": "y"})
    assert stored_json_size({"brokerInfo": {"n2/x": "y", **kept}}) <= DATA_MAX_BYTES
    assert len(kept) + len(problems) == len(entries)


def test_the_apply_names_the_version_read() -> None:
    body = apply_body(_claim(DEV), [_entry(DEV, {"n1/a": "1"})])
    assert body["metadata"] == {"name": "c", "namespace": "ns", "resourceVersion": "7"}
    assert body["status"] == {"devices": [_entry(DEV, {"n1/a": "1"})]}
