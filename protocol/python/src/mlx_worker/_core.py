"""What the blocking and the asyncio client share: finding the binary, framing requests,
routing the worker's messages to the calls that wait for them, its stderr's tail, and closing
every worker's stdin when the interpreter exits."""

from __future__ import annotations

import atexit
import collections
import itertools
import json
import os
import shutil
import threading
import weakref
from typing import Any, Callable, Iterable

from .errors import WorkerNotFoundError, error_from_response

#: The environment variable naming the worker binary when no path is given.
BINARY_ENV = "MLX_WORKER_BIN"

#: How a waiting call is told what arrived: ("delta" | "progress", params),
#: ("result", result), ("error", exception) or ("died", exception).
Sink = Callable[[str, Any], None]


#: Where the wheel (``cargo xtask wheel``) puts the binary: inside the package, so it finds the
#: environment's MLX at ``site-packages/mlx/lib`` through its rpath ``$ORIGIN/../../mlx/lib``.
PACKAGED_BINARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "mlx-worker")


def find_binary(binary: str | os.PathLike[str] | None = None) -> str:
    """The worker binary: ``binary`` if given, else ``$MLX_WORKER_BIN``, else the one the wheel
    installed with this package, else ``mlx-worker`` on PATH."""
    if binary is not None:
        path = os.fspath(binary)
        where = "the path given"
    elif os.environ.get(BINARY_ENV):
        path = os.environ[BINARY_ENV]
        where = f"${BINARY_ENV}"
    elif os.path.isfile(PACKAGED_BINARY):
        path = PACKAGED_BINARY
        where = "the binary installed with this package"
    else:
        found = shutil.which("mlx-worker")
        if found is None:
            raise WorkerNotFoundError(
                f"no mlx-worker binary: install the mlx-worker wheel, pass its path, set "
                f"{BINARY_ENV}, or put mlx-worker on PATH"
            )
        return found
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise WorkerNotFoundError(f"{where} is not an executable mlx-worker: {path}")
    return path


def drop_none(params: dict[str, Any]) -> dict[str, Any]:
    """Params without the members set to None (absent means the contract's default)."""
    return {k: v for k, v in params.items() if v is not None}


class Router:
    """Request ids, request lines, and the routing of responses and notifications by id."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._sinks: dict[Any, Sink] = {}
        self._lock = threading.Lock()

    def open(self, sink: Sink) -> int:
        """A new request id whose messages go to ``sink``."""
        with self._lock:
            request_id = next(self._ids)
            self._sinks[request_id] = sink
            return request_id

    def close(self, request_id: Any) -> None:
        """Stops routing to ``request_id`` (its late messages are dropped)."""
        with self._lock:
            self._sinks.pop(request_id, None)

    @staticmethod
    def line(request_id: Any, method: str, params: dict[str, Any] | None) -> bytes:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        return (json.dumps(message, ensure_ascii=False) + "\n").encode("utf-8")

    def route(self, raw: bytes | str) -> None:
        """Delivers one stdout line to the call it belongs to."""
        try:
            message = json.loads(raw)
        except ValueError:
            return  # stdout carries protocol messages only; nothing to route
        if not isinstance(message, dict):
            return
        method = message.get("method")
        if method is not None:
            params = message.get("params") or {}
            kind = {"generate/delta": "delta", "load/progress": "progress"}.get(method)
            if kind is not None:
                with self._lock:
                    sink = self._sinks.get(params.get("request_id"))
                if sink is not None:
                    sink(kind, params)
            return
        with self._lock:
            sink = self._sinks.pop(message.get("id"), None)
        if sink is None:
            return
        if "error" in message:
            sink("error", error_from_response(message["error"]))
        else:
            sink("result", message.get("result"))

    def fail_all(self, error: BaseException) -> None:
        """Every waiting call gets ``error`` (the worker died)."""
        with self._lock:
            sinks = list(self._sinks.values())
            self._sinks.clear()
        for sink in sinks:
            sink("died", error)


class StderrTail:
    """The last lines of the worker's log, kept for the error that reports its death."""

    def __init__(self, lines: int = 40) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=lines)
        self._lock = threading.Lock()

    def add(self, line: bytes | str) -> None:
        text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
        with self._lock:
            self._lines.append(text.rstrip("\n"))

    def text(self) -> str:
        with self._lock:
            return "\n".join(self._lines)


# Clients whose worker's stdin is closed when the interpreter exits.
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def track(client: Any) -> None:
    """Closes ``client``'s worker's stdin at interpreter exit (``client._close_stdin()``): end
    of stdin makes the worker finish and exit, so none outlives its host."""
    _LIVE.add(client)


def _close_all_at_exit(clients: Iterable[Any] = _LIVE) -> None:
    for client in list(clients):
        try:
            client._close_stdin()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


atexit.register(_close_all_at_exit)
