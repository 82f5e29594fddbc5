"""The webhook follows its certificate's source while it serves (akri_trio.webhook.rotation):
a changed certificate is what the next handshake gets, from the same SSLContext, with no
restart; a source that fails or gives something unloadable keeps the certificate it has."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import ssl
from pathlib import Path

import trio
import trio.testing

from akri_trio.webhook.certs import ServingCerts, serving_certs
from akri_trio.webhook.rotation import files_source, keep_serving_cert
from akri_trio.webhook.server import server_ssl_context

PERIOD = 60.0


def _served(context: ssl.SSLContext) -> bytes:
    """The certificate (DER) a new connection to `context` is shown: a handshake in memory."""
    client_ctx = ssl.create_default_context()
    client_ctx.check_hostname = False
    client_ctx.verify_mode = ssl.CERT_NONE
    into_server, into_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = context.wrap_bio(into_server, into_client, server_side=True)
    client = client_ctx.wrap_bio(into_client, into_server)
    done: set[int] = set()
    for _ in range(10):
        for i, end in enumerate((client, server)):
            with contextlib.suppress(ssl.SSLWantReadError):
                end.do_handshake()
                done.add(i)
        if done == {0, 1}:
            der = client.getpeercert(binary_form=True)
            assert der is not None
            return der
    raise AssertionError("handshake did not finish")


def _der(certs: ServingCerts) -> bytes:
    return ssl.PEM_cert_to_DER_cert(certs.cert_pem.decode())


def _write(directory: Path, certs: ServingCerts) -> None:
    (directory / "tls.crt").write_bytes(certs.cert_pem)
    (directory / "tls.key").write_bytes(certs.key_pem)


async def test_a_renewed_file_is_served_from_the_next_handshake(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)
    first, second = (serving_certs("hook", "akri", now) for _ in range(2))
    _write(tmp_path, first)
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    context = server_ssl_context(None, None)  # nothing yet: the keeper loads it
    async with trio.open_nursery() as nursery:
        await nursery.start(
            functools.partial(keep_serving_cert, context, files_source(crt, key), period=PERIOD)
        )
        assert _served(context) == _der(first)
        _write(tmp_path, second)  # as the kubelet does when the Secret changes
        await trio.sleep(PERIOD + 1)  # the next look
        assert _served(context) == _der(second)
        (tmp_path / "tls.key").write_bytes(b"not a key")  # a half-written or broken update
        await trio.sleep(3 * PERIOD)
        assert _served(context) == _der(second)  # kept
        nursery.cancel_scope.cancel()
