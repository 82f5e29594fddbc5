"""kubeconfig `exec` credential plugins, the live half: run the program, use its answer.

`ExecAuth` is the httpx auth of a client whose kubeconfig user names an `exec` plugin. It runs
the plugin before the first request, again when the credential is about to expire
(`exec_credential.refresh_due`) and once after a 401 (the credential may have been revoked),
retrying that request with the new credential. Concurrent requests share one run: the first
to find the credential stale runs the plugin under a lock, the rest use its answer.

The plugin runs as a trio subprocess (the event loop keeps serving while it works), with stdin
closed (interactiveMode Never: there is no terminal to ask on), a deadline and bounded output;
a plugin that fails, hangs, floods or answers nonsense is one `ConfigError` line naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from functools import partial
from typing import Final

import httpx
import trio

from akri_trio.kube.errors import ConfigError
from akri_trio.kube.exec_credential import Credential, ExecPlugin, parse_exec_output, refresh_due

# A plugin may call a cloud's token endpoint; a minute covers a slow one, and a hung one fails.
EXEC_TIMEOUT_S: Final = 60.0
# An ExecCredential is a few KiB (a certificate chain at most); more is not a credential.
EXEC_OUTPUT_LIMIT: Final = 1 << 20


class _TooMuchOutput(Exception):
    pass


async def _read_bounded(stream: trio.abc.ReceiveStream, limit: int, into: bytearray) -> None:
    while chunk := await stream.receive_some(65536):
        into += chunk
        if len(into) > limit:
            raise _TooMuchOutput


async def run_plugin(
    argv: list[str], env: Mapping[str, str], *, limit: int = EXEC_OUTPUT_LIMIT
) -> tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of one run. Output past `limit` (either stream) kills the
    program and raises `_TooMuchOutput`; cancelling the caller kills it too (trio.run_process)."""
    out, err = bytearray(), bytearray()
    try:
        async with trio.open_nursery() as nursery:
            proc: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=dict(env),
                    check=False,
                    deliver_cancel=_kill,
                )
            )
            assert proc.stdout is not None and proc.stderr is not None
            nursery.start_soon(_read_bounded, proc.stderr, limit, err)
            await _read_bounded(proc.stdout, limit, out)
    except BaseExceptionGroup as group:
        # The nursery wraps what failed; callers want the one failure, not the group.
        while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
            group = group.exceptions[0]
        if isinstance(group, OSError | _TooMuchOutput):
            raise group from None
        raise
    assert proc.returncode is not None
    return proc.returncode, bytes(out), bytes(err)


async def _kill(proc: trio.Process) -> None:
    """A credential plugin has nothing to save: a cancelled run is killed at once."""
    proc.kill()


def _last_line(text: bytes) -> str:
    lines = [line.strip() for line in text.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


class ExecAuth(httpx.Auth):
    """Bearer token or client certificate from an `exec` plugin, refreshed before expiry and
    after a 401. A certificate is loaded into the client's TLS context (`load_identity`), so
    connections opened after a refresh present the new one."""

    def __init__(
        self,
        plugin: ExecPlugin,
        *,
        exec_info: Mapping[str, object],
        load_identity: Callable[[bytes, bytes], None],
        timeout: float = EXEC_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.plugin = plugin
        self.runs = 0
        self._env = {
            **os.environ,
            **dict(plugin.env),
            "KUBERNETES_EXEC_INFO": json.dumps(exec_info),
        }
        self._load_identity = load_identity
        self._timeout = timeout
        self._clock = clock
        self._cred: Credential | None = None
        self._lock = trio.Lock()

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response]:
        raise ConfigError(f"kubeconfig: {self.plugin.name} needs the async client")
        yield request  # pragma: no cover - makes this a generator, as httpx expects

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        used = await self.credential()
        self._apply(request, used)
        response = yield request
        if response.status_code == 401:
            fresh = await self.credential(stale=used)
            if fresh is not used:
                self._apply(request, fresh)
                yield request

    async def credential(self, *, stale: Credential | None = None) -> Credential:
        """The credential to send: the cached one unless it is `stale` or due for refresh."""
        async with self._lock:
            cred = self._cred
            if cred is None or cred is stale or refresh_due(cred, self._clock()):
                cred = self._cred = await self._run()
            return cred

    async def _run(self) -> Credential:
        argv = [self.plugin.command, *self.plugin.args]
        where = f"kubeconfig: {self.plugin.name}"
        self.runs += 1
        try:
            with trio.fail_after(self._timeout):
                code, out, err = await run_plugin(argv, self._env)
        except trio.TooSlowError:
            raise ConfigError(f"{where} did not answer within {self._timeout:g} s") from None
        except _TooMuchOutput:
            raise ConfigError(f"{where} printed more than {EXEC_OUTPUT_LIMIT} bytes") from None
        except OSError as exc:
            first = self.plugin.install_hint.splitlines()[:1]
            hint = f" ({first[0]})" if first else ""
            raise ConfigError(f"{where} cannot run: {exc.strerror or exc}{hint}") from None
        if code != 0:
            said = _last_line(err) or _last_line(out)
            said = f": {said}" if said else ""
            raise ConfigError(f"{where} failed with exit status {code}{said}")
        cred = parse_exec_output(out, self.plugin, now=self._clock())
        if cred.client_cert_pem and cred.client_key_pem:
            self._load_identity(cred.client_cert_pem, cred.client_key_pem)
        return cred

    @staticmethod
    def _apply(request: httpx.Request, cred: Credential) -> None:
        if cred.token:
            request.headers["Authorization"] = f"Bearer {cred.token}"
        else:
            request.headers.pop("Authorization", None)
