"""bench/_nsproxy.py's rewrites: what upstream's processes are shown of the shared cluster."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench._nsproxy import SHOWN, STORED, Renamer, pin, rewrite_head


def test_pin_moves_cluster_wide_lists_and_watches_into_the_namespace() -> None:
    assert (
        pin(b"/apis/akri.sh/v0/instances?watch=true&resourceVersion=5", b"ns")
        == b"/apis/akri.sh/v0/namespaces/ns/instances?watch=true&resourceVersion=5"
    )
    assert pin(b"/api/v1/pods", b"ns") == b"/api/v1/namespaces/ns/pods"


def test_pin_leaves_namespaced_paths_and_other_resources_alone() -> None:
    for target in (
        b"/apis/akri.sh/v0/namespaces/other/instances/x",
        b"/api/v1/nodes?watch=true",
        b"/apis/akri.sh/v0/instancesx",
    ):
        assert pin(target, b"ns") == target


def test_rewrite_head_drops_accept_encoding_and_reads_the_body_length() -> None:
    head = (
        b"PATCH /apis/akri.sh/v0/configurations HTTP/1.1\r\nHost: x\r\n"
        b"Accept-Encoding: gzip\r\nContent-Length: 12"
    )
    out, length = rewrite_head(head, b"ns")
    assert length == 12
    assert out == (
        b"PATCH /apis/akri.sh/v0/namespaces/ns/configurations HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: 12"
    )


@given(st.lists(st.integers(min_value=0, max_value=60), max_size=6))
def test_renamer_replaces_the_name_wherever_the_stream_is_cut(cuts: list[int]) -> None:
    stream = b'{"name":"benchEcho","x":"benchEchoes"}\n' * 2 + b'"bench'
    pieces, start = [], 0
    for cut in sorted(cuts):
        pieces.append(stream[start:cut])
        start = max(start, cut)
    pieces.append(stream[start:])
    renamer = Renamer(STORED, SHOWN)
    out = b"".join(renamer.feed(p) for p in pieces) + renamer.carry
    assert out == stream.replace(STORED, SHOWN)


def test_renamer_holds_back_nothing_at_an_event_end() -> None:
    renamer = Renamer(STORED, SHOWN)
    assert renamer.feed(b'{"a":"benchEcho"}\n\r\n') == b'{"a":"debugEcho"}\n\r\n'
