"""Object keys and the layering rule that put them (and `Resource`) in a module of their own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from akri_trio.address import ObjectKey


def test_key_of_an_object() -> None:
    assert ObjectKey.of({"metadata": {"namespace": "ns", "name": "a"}}) == ObjectKey("ns", "a")
    assert ObjectKey.of({"metadata": {"name": "node1"}}) == ObjectKey("", "node1")
    with pytest.raises(ValueError):
        ObjectKey.of({"metadata": {}})


def test_str_is_client_go_key() -> None:
    assert str(ObjectKey("ns", "a")) == "ns/a"
    assert str(ObjectKey("", "node1")) == "node1"


def test_keys_order_by_namespace_then_name() -> None:
    keys = [ObjectKey("b", "a"), ObjectKey("a", "z"), ObjectKey("a", "b"), ObjectKey("", "n")]
    assert sorted(keys) == [
        ObjectKey("", "n"),
        ObjectKey("a", "b"),
        ObjectKey("a", "z"),
        ObjectKey("b", "a"),
    ]


def test_model_imports_nothing_that_does_io() -> None:
    code = (
        "import sys, akri_trio.model.resources, akri_trio.model.convert, akri_trio.model.naming\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('trio', 'httpx', 'purerpc')"
        " or m.startswith('akri_trio.kube'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
