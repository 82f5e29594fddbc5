"""The preparer without a usable API server or checkpoint: a prepare call is bounded in time
(against an API server that never answers, every claim of the call is answered "timed out"
after PREPARE_TIMEOUT_S, the kubelet then asks again, and nothing is written; under the
autojump clock, the silent server a real TCP listener), and an unreadable checkpoint is moved
aside, not fatal, with unprepare still removing a claim's CDI spec by its uid; a checkpoint
that cannot be written leaves the record as it was (the claim is answered with the error), and
a written one has its directory synced too."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from akri_trio.agent.dra.preparer import (
    PREPARE_TIMEOUT_S,
    ClaimRef,
    Preparer,
    write_atomically,
)
from akri_trio.agent.view import NodeView
from akri_trio.dra import spec_file_name
from akri_trio.dra.checkpoint import PreparedClaim, PreparedDevice, encode
from akri_trio.kube import Client
from tests.support.silent_server import silent_api_server


def _loaded(http: httpx.AsyncClient, tmp_path: Path) -> Preparer:
    preparer = Preparer(
        Client(http),
        NodeView("n1"),
        cdi_dir=tmp_path / "cdi",
        state_dir=tmp_path / "state",
        consumable=True,
    )
    preparer.load()
    return preparer


async def test_a_silent_api_server_times_the_call_out(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with silent_api_server() as http:
        preparer = _loaded(http, tmp_path)
        refs = [ClaimRef("ns", "uid-1", "c1"), ClaimRef("ns", "uid-2", "c2")]
        started = trio.current_time()
        answers = await preparer.prepare(refs)
        assert trio.current_time() - started == PREPARE_TIMEOUT_S
    assert answers == {
        "uid-1": "prepare ns/c1: timed out",
        "uid-2": "prepare ns/c2: timed out",
    }
    assert not list((tmp_path / "cdi").iterdir())
    assert preparer.prepared == {}


async def test_an_unreadable_checkpoint_is_moved_aside_and_unprepare_still_works(
    tmp_path: Path,
) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "checkpoint.json").write_text("{not json")
    (tmp_path / "cdi").mkdir()
    spec = tmp_path / "cdi" / spec_file_name("uid-1")
    spec.write_text("{}")
    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as http:
        preparer = _loaded(http, tmp_path)
        assert preparer.prepared == {}
        assert (tmp_path / "state" / "checkpoint.json.unreadable").read_text() == "{not json"
        answers = await preparer.unprepare([ClaimRef("ns", "uid-1", "c1")])
    assert not isinstance(answers["uid-1"], str)
    assert not spec.exists()


HELD = PreparedClaim(
    "ns", "c1", (PreparedDevice(("cam",), "node/n1/ns", "cam-abc123", ("akri.sh/claim=x",)),), "f"
)


async def test_a_failed_checkpoint_write_forgets_nothing(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    checkpoint = tmp_path / "state" / "checkpoint.json"
    checkpoint.write_text(encode({"uid-1": HELD}))
    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as http:
        preparer = _loaded(http, tmp_path)
        assert preparer.prepared == {"uid-1": HELD}
        # The checkpoint cannot be replaced now (a non-empty directory in its place).
        checkpoint.unlink()
        checkpoint.mkdir()
        (checkpoint / "x").touch()
        answers = await preparer.unprepare([ClaimRef("ns", "uid-1", "c1")])
        assert isinstance(answers["uid-1"], str) and answers["uid-1"].startswith("unprepare")
        assert preparer.prepared == {"uid-1": HELD}  # the kubelet asks again; still known
        other = PreparedClaim("ns", "c2", (), "g")
        with pytest.raises(OSError):
            preparer._save({**preparer.prepared, "uid-2": other})  # what prepare writes
        assert preparer.prepared == {"uid-1": HELD}


def test_writing_atomically_syncs_the_file_and_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[bool] = []  # is a directory, per fsync

    def fsync(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomically(tmp_path / "a.json", "{}")
    assert (tmp_path / "a.json").read_text() == "{}"
    assert synced == [False, True]
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
