"""brokerInfo without a cluster: which files count (limits, names, UTF-8), the key scheme, the
merge of several directories, what happens to a workload's directory once its slot is freed,
the file-system edge against hostile entries, and the mount Allocate (or Prepare) hands out
(`WorkloadDirs`)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import cast

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from akri_trio.address import ObjectKey
from akri_trio.agent.brokerinfo import (
    BrokerInfo,
    FileRead,
    Limits,
    Selection,
    WorkloadDir,
    WorkloadDirs,
    _disk,
    entry_key,
    field_manager,
    merge,
    node_entries,
    plan_dirs,
    select,
)
from akri_trio.agent.brokerinfo._disk import carry_out, make_workload_dir, read_workload
from akri_trio.agent.brokerinfo._rules import (
    DirPlan,
    apply_body,
    desired_entries,
    foreign_entries,
    parse_dir,
    removal_ops,
    set_aside,
    superseded,
)
from akri_trio.agent.cli import parse_args
from akri_trio.agent.events import condition_events
from akri_trio.agent.plugins.service import container_response
from akri_trio.agent.status import node_entry
from akri_trio.agent.view import NodeView
from akri_trio.kube.client import Client
from akri_trio.model.resources import JSON, Instance

LIMITS = Limits(max_files=3, max_file_bytes=8, max_total_bytes=12)


def _f(name: str, data: bytes | None = b"x", mtime: float = 1.0, problem: str = "") -> FileRead:
    return FileRead(name, mtime, data, problem)


# --- which files count ---------------------------------------------------------------------------


def test_files_are_kept_in_name_order() -> None:
    sel = select([_f("b", b"2"), _f("a", b"1")], LIMITS)
    assert dict(sel.files) == {"a": (1.0, "1"), "b": (1.0, "2")}
    assert sel.problems == ()


def test_dot_files_are_ignored_without_a_report() -> None:
    assert select([_f(".status.tmp", b"half")], LIMITS) == Selection({})


def test_a_file_over_the_per_file_limit_is_reported_and_skipped() -> None:
    sel = select([_f("big", b"123456789"), _f("ok", b"1")], LIMITS)
    assert list(sel.files) == ["ok"]
    assert sel.problems == ("'big': over 8 bytes",)


def test_a_file_that_is_not_utf8_is_reported_and_skipped() -> None:
    sel = select([_f("bin", b"\xff\xfe"), _f("ok", "é".encode())], LIMITS)
    assert dict(sel.files) == {"ok": (1.0, "é")}
    assert sel.problems == ("'bin': not UTF-8",)


def test_files_past_the_count_and_total_limits_are_reported() -> None:
    many = select([_f(n, b"1") for n in "abcd"], LIMITS)
    assert list(many.files) == ["a", "b", "c"]
    assert many.problems == ("'d': more than 3 files",)
    total = select([_f("a", b"1234567"), _f("b", b"1234567")], LIMITS)
    assert list(total.files) == ["a"]
    assert total.problems == ("'b': over 12 bytes in all",)


def test_bad_names_and_unreadable_entries_are_reported() -> None:
    sel = select([_f("a b"), _f("sub", None, problem="not a regular file")], LIMITS)
    assert sel.files == {}
    assert sel.problems == (
        "'a b': name is not [-._a-zA-Z0-9]{1,253}",
        "'sub': not a regular file",
    )


@given(
    st.lists(
        st.builds(
            FileRead,
            st.text(alphabet="ab.- é", min_size=1, max_size=4),
            st.floats(0, 10),
            st.one_of(st.none(), st.binary(max_size=12)),
        ),
        unique_by=lambda f: f.name,
        max_size=8,
    )
)
def test_every_file_is_kept_or_reported_once_and_the_limits_hold(found: list[FileRead]) -> None:
    sel = select(found, LIMITS)
    assert len(sel.files) <= LIMITS.max_files
    assert sum(len(t.encode()) for _, t in sel.files.values()) <= LIMITS.max_total_bytes
    visible = sorted(f.name for f in found if not f.name.startswith("."))
    reported = [p.split("'")[1] for p in sel.problems]
    assert sorted([*sel.files, *reported]) == visible


def test_limits_refuse_what_the_crd_would_refuse() -> None:
    with pytest.raises(ValueError, match="maxLength"):
        Limits(max_file_bytes=4097)
    with pytest.raises(ValueError, match="at least 1"):
        Limits(max_files=0)


# --- keys and merging ----------------------------------------------------------------------------


def test_keys_are_per_node_and_a_node_sees_only_its_own() -> None:
    assert entry_key("node-a", "firmware") == "node-a/firmware"
    info = {"node-a/firmware": "1", "node-ab/firmware": "2", "node-b/x": "3"}
    assert node_entries(info, "node-a") == {"node-a/firmware": "1"}
    assert node_entries(None, "node-a") == {}
    assert field_manager("node-a") == "brokerinfo-node-a"
    body = apply_body("ns", "cam-1", {"node-a/x": "1"})
    assert body["spec"] == {"brokerInfo": {"node-a/x": "1"}}
    assert "configurationName" not in body["spec"]  # never creates a deleted Instance
    assert apply_body("ns", "cam-1", {})["spec"] == {}


def test_the_newest_file_wins_a_name_two_workloads_share() -> None:
    older = Selection({"status": (1.0, "old"), "a": (1.0, "a")})
    newer = Selection({"status": (2.0, "new")})
    assert merge([newer, older]) == {"a": "a", "status": "new"}
    assert merge([older, Selection({"status": (1.0, "tie")})])["status"] == "tie"


# --- workload directories ------------------------------------------------------------------------


@given(
    st.from_regex(r"[a-z0-9.-]{1,20}", fullmatch=True),
    st.integers(0, 2**40),
    st.from_regex(r"[0-9a-f]{1,8}", fullmatch=True),
    st.booleans(),
)
def test_directory_names_round_trip(slot: str, generation: int, token: str, ended: bool) -> None:
    wd = WorkloadDir(slot, generation, token, ended)
    assert parse_dir(wd.name) == wd


def test_a_held_slot_keeps_its_directory_live() -> None:
    plan = plan_dirs(["cam-0.g3.a"], held={"cam-0"}, serving=True, generation=3)
    assert plan == DirPlan(report_from=("cam-0.g3.a",))


def test_a_freed_slot_of_the_current_generation_leaves_its_report() -> None:
    plan = plan_dirs(["cam-0.g3.a"], held=set(), serving=True, generation=3)
    assert plan == DirPlan(
        end=(("cam-0.g3.a", "ended-cam-0.g3.a"),), report_from=("ended-cam-0.g3.a",)
    )


def test_a_new_workload_replaces_the_report_of_the_ended_one() -> None:
    plan = plan_dirs(["cam-1.g3.a", "ended-cam-0.g3.a"], held={"cam-1"}, serving=True, generation=3)
    assert plan == DirPlan(remove=("ended-cam-0.g3.a",), report_from=("cam-1.g3.a",))


def test_a_new_generation_drops_the_old_generation_s_reports() -> None:
    plan = plan_dirs(["cam-0.g3.a", "ended-cam-1.g3.a"], held=set(), serving=True, generation=4)
    assert plan == DirPlan(remove=("cam-0.g3.a", "ended-cam-1.g3.a"))


def test_an_instance_the_node_no_longer_serves_loses_everything() -> None:
    gone = DirPlan(remove_all=True, remove=("cam-0.g3.a",))
    assert plan_dirs(["cam-0.g3.a"], held={"cam-0"}, serving=False, generation=3) == gone
    assert plan_dirs(["cam-0.g3.a"], held={"cam-0"}, serving=True, generation=None) == gone


def test_unknown_entries_are_removed() -> None:
    plan = plan_dirs(["junk", "cam-0.g1.a"], held={"cam-0"}, serving=True, generation=1)
    assert plan.remove == ("junk",)


@given(
    st.lists(
        st.builds(
            WorkloadDir, st.sampled_from(["c-0", "c-1", "c-2"]), st.integers(1, 3), st.just("a")
        ),
        unique_by=lambda w: w.name,
        max_size=5,
    ),
    st.lists(
        st.builds(
            WorkloadDir,
            st.sampled_from(["c-0", "c-1"]),
            st.integers(1, 3),
            st.just("a"),
            st.just(True),
        ),
        unique_by=lambda w: w.name,
        max_size=3,
    ),
    st.sets(st.sampled_from(["c-0", "c-1", "c-2"])),
    st.integers(1, 3),
)
def test_a_node_reports_from_live_or_ended_directories_never_both(
    live: list[WorkloadDir], ended: list[WorkloadDir], held: set[str], generation: int
) -> None:
    names = [w.name for w in live + ended]
    plan = plan_dirs(names, held=held, serving=True, generation=generation)
    after = (set(names) - set(plan.remove) - {a for a, _ in plan.end}) | {b for _, b in plan.end}
    assert set(plan.report_from) <= after
    reported = [parse_dir(n) for n in plan.report_from]
    kinds = {w.ended for w in reported if w is not None}
    assert len(kinds) <= 1
    if any(w.slot in held for w in live):
        assert kinds == {False}
    # Every directory of a slot no longer held is gone or ended.
    for w in live:
        if w.slot not in held:
            assert w.name not in after


# --- the file system edge ------------------------------------------------------------------------


def test_a_workload_directory_starts_empty_and_writable_by_anyone(tmp_path: Path) -> None:
    key = ObjectKey("ns", "cam-1")
    path = make_workload_dir(tmp_path, key, WorkloadDir("cam-1-0", 1, "a"))
    assert list(path.iterdir()) == []
    assert path.stat().st_mode & 0o777 == 0o777
    assert path == tmp_path / "ns" / "cam-1" / "cam-1-0.g1.a"


def test_a_new_workload_on_a_slot_sets_the_one_before_aside(tmp_path: Path) -> None:
    key = ObjectKey("ns", "cam-1")
    old = make_workload_dir(tmp_path, key, WorkloadDir("cam-1-0", 1, "a"))  # generation 1's Job
    for n in range(200):  # what a broker left behind is not removed inside Allocate
        (old / f"f{n}").write_text("x")
    make_workload_dir(tmp_path, key, WorkloadDir("cam-1-1", 1, "b"))
    # The kubelet gives slot 0 to generation 2's Job before the reclaimer freed it.
    make_workload_dir(tmp_path, key, WorkloadDir("cam-1-0", 2, "c"))
    inst = tmp_path / "ns" / "cam-1"
    names = sorted(os.listdir(inst))
    assert names == ["cam-1-0.g1.a.superseded", "cam-1-0.g2.c", "cam-1-1.g1.b"]
    assert len(os.listdir(inst / "cam-1-0.g1.a.superseded")) == 200
    assert superseded(["cam-1-0.g1.a", "ended-cam-1-0.g1.a", "cam-1-00.g1.a"], "cam-1-0") == [
        "cam-1-0.g1.a"
    ]
    # The next copy pass removes the set-aside directory (in its worker thread).
    plan = plan_dirs(names, held={"cam-1-0", "cam-1-1"}, serving=True, generation=2)
    assert plan.remove == ("cam-1-0.g1.a.superseded",)
    carry_out(inst, plan)
    assert sorted(os.listdir(inst)) == ["cam-1-0.g2.c", "cam-1-1.g1.b"]


@given(
    st.from_regex(r"[a-z0-9.-]{1,20}", fullmatch=True),
    st.integers(0, 2**40),
    st.from_regex(r"[0-9a-f]{1,8}", fullmatch=True),
    st.booleans(),
)
def test_a_set_aside_name_is_never_a_workload_directory(
    slot: str, generation: int, token: str, ended: bool
) -> None:
    assert parse_dir(set_aside(WorkloadDir(slot, generation, token, ended).name)) is None


def test_symlinks_fifos_and_directories_are_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("host file")
    work = tmp_path / "w"
    work.mkdir()
    (work / "link").symlink_to(secret)
    os.mkfifo(work / "fifo")
    (work / "sub").mkdir()
    (work / "big").write_bytes(b"x" * 100_000)
    (work / "ok").write_text("fine")
    found = {f.name: f for f in read_workload(work, LIMITS)}
    assert found["link"].data is None and found["link"].problem == "a symbolic link"
    assert found["fifo"].data is None and found["fifo"].problem == "not a regular file"
    assert found["sub"].data is None
    assert found["big"].data == b"x" * (LIMITS.max_file_bytes + 1)  # read no further
    assert found["ok"].data == b"fine"


def test_only_entries_the_listing_calls_regular_files_are_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "w"
    work.mkdir()
    (work / "link").symlink_to(tmp_path)
    os.mkfifo(work / "fifo")
    (work / "sub").mkdir()
    (work / "ok").write_text("fine")
    with contextlib.suppress(PermissionError):  # a broker with CAP_MKNOD: /dev/null's numbers
        os.mknod(work / "dev", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    opened: list[str] = []
    real_open = os.open

    def spy(path: str, flags: int, *args: int) -> int:
        opened.append(os.path.basename(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", spy)
    found = {f.name: f for f in read_workload(work, LIMITS)}
    assert opened == ["ok"]
    assert found["link"].problem == "a symbolic link"
    assert {found[n].problem for n in found if n not in ("ok", "link")} == {"not a regular file"}


def test_carrying_out_a_plan_renames_and_removes(tmp_path: Path) -> None:
    for name in ("cam-0.g1.a", "cam-1.g1.a", "junk"):
        (tmp_path / name).mkdir()
    (tmp_path / "cam-0.g1.a" / "status").write_text("done")
    carry_out(
        tmp_path, DirPlan(end=(("cam-0.g1.a", "ended-cam-0.g1.a"),), remove=("cam-1.g1.a", "junk"))
    )
    assert sorted(os.listdir(tmp_path)) == ["ended-cam-0.g1.a"]
    assert (tmp_path / "ended-cam-0.g1.a" / "status").read_text() == "done"
    carry_out(tmp_path, DirPlan(remove_all=True, remove=("ended-cam-0.g1.a",)))
    assert not tmp_path.exists()  # and the Instance's directory with it
    carry_out(tmp_path / "x", DirPlan(remove_all=True))  # already gone: nothing to do


# --- Allocate ------------------------------------------------------------------------------------


def test_allocate_mounts_a_directory_per_instance_and_says_where(tmp_path: Path) -> None:
    view = NodeView("n")
    for name, digest in (("cam-aaaaaa", "aaaaaa"), ("cam-bbbbbb", "bbbbbb")):
        view.put_instance(
            {
                "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
                "spec": {
                    "configurationName": "cam",
                    "cdiName": f"akri.sh/cam={digest}",
                    "capacity": 2,
                },
            }
        )
    a, b = (
        view.instance(ObjectKey("ns", "cam-aaaaaa")),
        view.instance(ObjectKey("ns", "cam-bbbbbb")),
    )
    assert a is not None and b is not None
    generations = {ObjectKey("ns", "cam"): 7}
    dirs = WorkloadDirs(tmp_path, generation=generations.get)
    given = {"cam-aaaaaa": ["cam-aaaaaa-1", "cam-aaaaaa-0"], "cam-bbbbbb": ["cam-bbbbbb-1"]}
    response = container_response([a, b], view, dirs, given)
    assert {(m.container_path, m.host_path, m.read_only) for m in response.mounts} == {
        ("/akri/broker-info/cam-aaaaaa", str(_one(tmp_path / "ns/cam-aaaaaa")), False),
        ("/akri/broker-info/cam-bbbbbb", str(_one(tmp_path / "ns/cam-bbbbbb")), False),
    }
    assert dict(response.envs) == {
        "AKRI_BROKER_INFO": "/akri/broker-info/cam-bbbbbb",  # the last, like broker properties
        "AKRI_BROKER_INFO_AAAAAA": "/akri/broker-info/cam-aaaaaa",
        "AKRI_BROKER_INFO_BBBBBB": "/akri/broker-info/cam-bbbbbb",
    }
    made = parse_dir(_one(tmp_path / "ns/cam-aaaaaa").name)
    assert made is not None and (made.slot, made.generation) == ("cam-aaaaaa-0", 7)


def _one(path: Path) -> Path:
    (only,) = path.iterdir()
    return only


def _instance(view: NodeView, name: str = "cam-aaaaaa") -> Instance:
    return view.put_instance(
        {
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
            "spec": {"configurationName": "cam", "cdiName": "akri.sh/cam=aaaaaa", "capacity": 2},
        }
    )


def test_workload_dirs_name_a_directory_for_the_lowest_slot_and_the_generation_at_mount(
    tmp_path: Path,
) -> None:
    generations = {ObjectKey("ns", "cam"): 3}
    dirs = WorkloadDirs(tmp_path / "bi", generation=generations.get)
    inst = _instance(NodeView("n"))
    first = dirs.mount(inst, ["cam-aaaaaa-1", "cam-aaaaaa-0"])
    generations[ObjectKey("ns", "cam")] = 4  # read at each mount, not when built
    second = dirs.mount(inst, ["cam-aaaaaa-1"])
    assert first is not None and second is not None
    made = [parse_dir(Path(m.host_path).name) for m in (first, second)]
    assert [(d.slot, d.generation) for d in made if d is not None] == [
        ("cam-aaaaaa-0", 3),
        ("cam-aaaaaa-1", 4),
    ]
    assert Path(first.host_path).parent == tmp_path / "bi" / "ns" / "cam-aaaaaa"
    assert first.container_path == "/akri/broker-info/cam-aaaaaa"
    assert dict(first.envs) == {
        "AKRI_BROKER_INFO": "/akri/broker-info/cam-aaaaaa",
        "AKRI_BROKER_INFO_AAAAAA": "/akri/broker-info/cam-aaaaaa",
    }


def test_workload_dirs_of_a_configuration_gone_are_generation_0(tmp_path: Path) -> None:
    dirs = WorkloadDirs(tmp_path, generation=lambda _: None)
    mount = dirs.mount(_instance(NodeView("n")), ["cam-aaaaaa-0"])
    assert mount is not None
    made = parse_dir(Path(mount.host_path).name)
    assert made is not None and made.generation == 0


def test_workload_dirs_mount_nothing_without_a_slot(tmp_path: Path) -> None:
    dirs = WorkloadDirs(tmp_path / "bi", generation=lambda _: 1)
    assert dirs.mount(_instance(NodeView("n")), []) is None
    assert not (tmp_path / "bi").exists()


def test_a_directory_workload_dirs_cannot_make_leaves_the_broker_without_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "bi"
    root.write_text("not a directory")  # a real OSError at mkdir
    dirs = WorkloadDirs(root, generation=lambda _: 1)
    assert dirs.mount(_instance(NodeView("n")), ["cam-aaaaaa-0"]) is None
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("no brokerInfo directory for ns/cam-aaaaaa (cam-aaaaaa-0.g1.")


def test_without_brokerinfo_allocate_mounts_nothing() -> None:
    view = NodeView("n")
    inst = view.put_instance(
        {
            "metadata": {"name": "cam-aaaaaa", "namespace": "ns", "resourceVersion": "1"},
            "spec": {"configurationName": "cam", "cdiName": "akri.sh/cam=aaaaaa", "capacity": 1},
        }
    )
    response = container_response([inst], view)
    assert not response.mounts and not response.envs


# --- reporting and flags -------------------------------------------------------------------------


def _entry(problems: list[str] | None, previous: dict[str, object] | None = None) -> JSON:
    return node_entry(
        node="n",
        handler="debugEcho",
        handlers={},
        invalid_details=[],
        unsolvable=None,
        other_problems=[],
        instances=1,
        previous=previous,
        now="t1",
        to_wall=str,
        broker_info_problems=problems,
    )


def test_skipped_files_turn_the_status_condition_false_and_record_an_event() -> None:
    ok = _entry([])
    cond = {c["type"]: c for c in ok["conditions"]}["BrokerInfoValid"]
    assert (cond["status"], cond["reason"]) == ("True", "Valid")
    bad = _entry(["cam-1: 'raw': not UTF-8"], previous=ok)
    cond = {c["type"]: c for c in bad["conditions"]}["BrokerInfoValid"]
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False",
        "FileSkipped",
        "cam-1: 'raw': not UTF-8",
    )
    assert condition_events(ok, bad) == [("BrokerInfoSkipped", "n: cam-1: 'raw': not UTF-8")]


def test_without_brokerinfo_the_status_has_no_condition_for_it() -> None:
    assert "BrokerInfoValid" not in {c["type"] for c in _entry(None)["conditions"]}


def test_flags_and_environment() -> None:
    off = parse_args(["--node-name", "n"], {})
    assert off.broker_info_dir is None
    on = parse_args(
        [
            *("--node-name", "n", "--broker-info-max-files", "2", "--broker-info-period", "0.5"),
            *("--broker-info-max-node-entries", "8", "--broker-info-max-node-bytes", "2048"),
        ],
        {"BROKER_INFO_DIRECTORY": "/var/lib/akri/broker-info"},
    )
    assert on.broker_info_dir == Path("/var/lib/akri/broker-info")
    assert on.broker_info_limits == Limits(max_files=2, max_node_entries=8, max_node_bytes=2048)
    assert on.broker_info_period == 0.5


def test_limits_beyond_the_crd_are_refused_at_start(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--node-name", "n", "--broker-info-max-file-bytes", "5000"], {})
    assert "maxLength" in capsys.readouterr().err


# --- a node's budget on one Instance, and entries it did not write --------------------------------


def test_a_node_s_entries_on_an_instance_stay_within_its_budget() -> None:
    # Two directories of 3 files each pass their own limits; the node's budget keeps 4.
    files = merge(
        [
            Selection({n: (1.0, "12345678") for n in "abc"}),
            Selection({n: (1.0, "1") for n in "def"}),
        ]
    )
    by_count = Limits(max_node_entries=4)
    entries, over = desired_entries("n", files, by_count)
    assert list(entries) == ["n/a", "n/b", "n/c", "n/d"]
    assert over == ["'e': more than 4 entries from n", "'f': more than 4 entries from n"]
    # Bytes count keys and values: "n/a" + 8 = 11 each.
    by_bytes = Limits(max_node_bytes=26)
    entries, over = desired_entries("n", files, by_bytes)
    assert list(entries) == ["n/a", "n/b", "n/d"]  # a small file still fits after a big one
    assert over[0] == "'c': over 26 bytes from n"


@given(
    st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), st.text(max_size=40)),
    st.integers(1, 8),
    st.integers(1, 200),
)
def test_the_budget_holds_and_every_file_is_kept_or_reported(
    files: dict[str, str], most: int, budget: int
) -> None:
    limits = Limits(max_node_entries=most, max_node_bytes=budget)
    entries, over = desired_entries("node", files, limits)
    assert len(entries) <= most
    assert sum(len(k.encode()) + len(v.encode()) for k, v in entries.items()) <= budget
    reported = [p.split("'")[1] for p in over]
    assert sorted([k.partition("/")[2] for k in entries] + reported) == sorted(files)


def test_the_node_budget_is_bounded_by_the_crd_and_one_etcd_object() -> None:
    with pytest.raises(ValueError, match="maxProperties"):
        Limits(max_node_entries=1025)
    with pytest.raises(ValueError, match="etcd"):
        Limits(max_node_bytes=256 * 1024 + 1)


def test_entries_another_writer_put_under_the_node_s_name_are_removed_if_unchanged() -> None:
    after_apply = {"n/mine": "1", "n/forged": "x", "m/other": "2", "n~1/odd": "y"}
    foreign = foreign_entries(after_apply, "n", {"n/mine": "1"})
    assert foreign == {"n/forged": "x"}
    assert removal_ops(foreign) == [
        {"op": "test", "path": "/spec/brokerInfo/n~1forged", "value": "x"},
        {"op": "remove", "path": "/spec/brokerInfo/n~1forged"},
    ]
    assert removal_ops({"n/a~b": "v"})[1]["path"] == "/spec/brokerInfo/n~1a~0b"
    assert foreign_entries(None, "n", {}) == {}


# --- file-system errors and shutdown --------------------------------------------------------------


def _serving_view(node: str = "n") -> tuple[NodeView, ObjectKey]:
    view = NodeView(node)
    view.put_instance(
        {
            "metadata": {"name": "cam-aaaaaa", "namespace": "ns", "resourceVersion": "1"},
            "spec": {
                "configurationName": "cam",
                "cdiName": "akri.sh/cam=aaaaaa",
                "capacity": 1,
                "nodes": [node],
                "deviceUsage": {"cam-aaaaaa-0": node},
            },
        }
    )
    return view, ObjectKey("ns", "cam-aaaaaa")


def _dirs(root: Path) -> WorkloadDirs:
    return WorkloadDirs(root, generation=lambda key: 1 if key == ObjectKey("ns", "cam") else None)


def _offline(view: NodeView, root: Path, current: dict[str, str] | None = None) -> BrokerInfo:
    """A copy loop with no API: a write it tried would raise."""
    return BrokerInfo(cast(Client, None), view, _dirs(root), current=lambda _: current)


async def test_a_directory_that_cannot_be_read_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    view, key = _serving_view()
    info = _offline(view, tmp_path)
    inst = view.instance(key)
    assert inst is not None
    mount = info.dirs.mount(inst, ["cam-aaaaaa-0"])
    assert mount is not None
    # A root broker's chmod 000 of its directory leaves an agent without CAP_DAC_OVERRIDE
    # unable to list it; the same kind of real OSError here: the "directory" is a file.
    path = trio.Path(mount.host_path)
    await path.rmdir()
    await path.write_text("not a directory")
    await info.pass_once()
    (problem,) = info.problems(ObjectKey("ns", "cam"))
    assert problem.startswith(f"cam-aaaaaa: cannot list {path.name}: [Errno 20] Not a directory")


async def test_file_system_errors_never_end_the_copy_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    view, key = _serving_view()
    info = _offline(view, tmp_path, current={"n/status": "ok"})  # written before
    inst = view.instance(key)
    assert inst is not None
    info.dirs.mount(inst, ["cam-aaaaaa-0"])

    def read_only(*_: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(_disk, "carry_out", read_only)
    await info.pass_once()  # and no write: what was written stays
    assert info.problems(ObjectKey("ns", "cam")) == [
        "cam-aaaaaa: cannot tidy its directories: [Errno 30] Read-only file system"
    ]

    def denied(*_: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(_disk, "instance_dirs", denied)
    caplog.clear()
    await info.pass_once()
    await info.pass_once()
    said = [r.getMessage() for r in caplog.records if "cannot list" in r.getMessage()]
    assert said == [
        f"brokerInfo: cannot list {tmp_path}: [Errno 13] Permission denied (retried every pass)"
    ]


async def test_shutdown_does_not_wait_for_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.abc.Clock
) -> None:
    view, _ = _serving_view()
    info = _offline(view, tmp_path)
    release = threading.Event()
    finished: list[bool] = []

    def slow(*_: object) -> dict[ObjectKey, list[str]]:
        release.wait(5)  # a removal of millions of files a broker left
        finished.append(True)
        return {}

    monkeypatch.setattr(_disk, "instance_dirs", slow)
    with trio.move_on_after(1):
        await info.pass_once()
    assert finished == []  # the pass was cancelled while the thread still worked
    release.set()


def test_brokerinfo_works_in_both_modes() -> None:
    for allocation in ("device-plugin", "dra"):
        argv = ["--node-name", "n", "--allocation", allocation, "--broker-info-dir", "/x"]
        assert parse_args(argv, {}).broker_info_dir == Path("/x")


def test_a_tree_of_any_depth_is_removed_without_following_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("node file")
    inst = tmp_path / "inst"
    (inst / "ended-cam-0.g1.a").mkdir(parents=True)
    # A broker's directories nested deeper than Python's recursion limit and PATH_MAX.
    fd = os.open(inst / "ended-cam-0.g1.a", os.O_RDONLY)
    for n in range(1500):
        os.mkdir("d", dir_fd=fd)
        if n % 100 == 0:
            os.symlink(outside, "link", dir_fd=fd)
            os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    (inst / "ended-cam-0.g1.a.superseded").symlink_to(outside)
    carry_out(inst, DirPlan(remove=("ended-cam-0.g1.a", "ended-cam-0.g1.a.superseded")))
    assert os.listdir(inst) == []
    assert os.listdir(outside) == ["keep"]


def _without_capabilities(*argv: str) -> subprocess.CompletedProcess[str]:
    """Python as this uid with no capabilities, as the shipped agent runs."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to drop capabilities")
    cmd = [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--", sys.executable, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60)


def test_an_agent_without_capabilities_removes_what_a_root_broker_locked(tmp_path: Path) -> None:
    locked = tmp_path / "inst" / "ended-cam-0.g1.a"
    (locked / "sub" / "deeper").mkdir(parents=True)
    (locked / "sub" / "f").write_text("x")
    (locked / "sub" / "deeper" / "g").write_text("x")
    (locked / "sub" / "deeper").chmod(0)
    (locked / "sub").chmod(0o500)
    locked.chmod(0)  # its own directory too
    other = tmp_path / "inst" / "ended-cam-1.g1.a"
    (other / "sub").mkdir(parents=True)
    (other / "sub" / "f").write_text("x")
    os.chown(other / "sub", 1000, 1000)  # another user's: not the agent's to open up
    (other / "sub").chmod(0o500)
    script = (
        "import sys; from pathlib import Path; "
        "from akri_trio.agent.brokerinfo._disk import remove_tree; "
        "[remove_tree(Path(p)) for p in sys.argv[1:]]; "
        "import os; print(os.listdir(sys.argv[1].rpartition('/')[0]))"
    )
    done = _without_capabilities("-c", script, str(locked), str(other))
    assert done.stdout.strip() == "['ended-cam-1.g1.a']"
    assert os.listdir(other / "sub") == ["f"]  # it stays, and removing it ended
