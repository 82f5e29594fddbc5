"""The bottom layer: small concurrency mechanisms every other package shares, once.

Nothing here imports anything of akri_trio, nor any library but trio, h11 and the standard
library, so any process (the agent, the controller, a discovery handler) can use it without
loading the rest: `Changed` (a version-counter wake-up), `TaskSet` (keyed child tasks with replace
and drop), `Backoff` (retry delays), `run_all` (the one batch-write policy: every write runs to
its end) and `sleep_to_tick` / `next_tick` (periodic loops wake together), re-exported here; and
two public modules imported by name, so a process loads only what it uses: `http` (the HTTP/1.1
server, on h11) and `logs` (every command's logging setup).
A discovery-handler process imports this, not akri_trio.kube (whose client loads httpx).
"""

from akri_trio.runtime._backoff import Backoff
from akri_trio.runtime._batch import run_all
from akri_trio.runtime._changed import Changed
from akri_trio.runtime._tasks import TaskSet
from akri_trio.runtime._ticks import next_tick, sleep_to_tick

__all__ = ["Backoff", "Changed", "TaskSet", "next_tick", "run_all", "sleep_to_tick"]
