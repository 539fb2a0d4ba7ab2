"""Exceptions: one class per JSON-RPC error code of the contract, and the worker's death.

Every error response becomes a :class:`WorkerError` subclass carrying ``code``, ``message`` and
``data`` (the typed ``data`` of protocol.md's error table, as a dict); :class:`LoadFailedError`
adds ``kind`` and ``detail``, :class:`InvalidParamsError` ``field`` and ``reason``.
"""

from __future__ import annotations

from typing import Any


class MLXWorkerError(Exception):
    """Base of every exception this package raises."""


class WorkerNotFoundError(MLXWorkerError, FileNotFoundError):
    """No ``mlx-worker`` binary: not at the path given, not in ``MLX_WORKER_BIN``, not on PATH."""


class WorkerDiedError(MLXWorkerError):
    """The worker process ended while requests were outstanding (or before a new one was sent).

    ``returncode`` is its exit status (negative: killed by that signal), ``stderr_tail`` the last
    lines of its log. The next ``load`` starts a fresh worker.
    """

    def __init__(self, returncode: int | None, stderr_tail: str) -> None:
        how = (
            "is gone"
            if returncode is None
            else f"was killed by signal {-returncode}"
            if returncode < 0
            else f"exited with status {returncode}"
        )
        message = f"the mlx-worker process {how}"
        if stderr_tail:
            message += "; the end of its log:\n" + stderr_tail
        super().__init__(message)
        self.returncode = returncode
        self.stderr_tail = stderr_tail


class WorkerError(MLXWorkerError):
    """A JSON-RPC error response: ``code``, ``message`` and ``data`` as the worker sent them."""

    code: int = 0

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (JSON-RPC error {code})")
        self.code = code
        self.message = message
        self.data = data


class ParseError(WorkerError):
    """-32700: the line was not valid UTF-8 or JSON."""

    code = -32700


class InvalidRequestError(WorkerError):
    """-32600: not a request object, a batch, or a line over the length limit."""

    code = -32600


class MethodNotFoundError(WorkerError):
    """-32601: no such method (audio commands included: audio is not supported)."""

    code = -32601


class InvalidParamsError(WorkerError):
    """-32602: a parameter is missing or wrong; ``field`` names it, ``reason`` says why."""

    code = -32602

    @property
    def field(self) -> str | None:
        return (self.data or {}).get("field")

    @property
    def reason(self) -> str | None:
        return (self.data or {}).get("reason")


class InternalError(WorkerError):
    """-32603: a fault inside the worker."""

    code = -32603


class NoModelError(WorkerError):
    """-32001: no model is loaded, or the named one is not resident."""

    code = -32001


class LoadFailedError(WorkerError):
    """-32002: a ``load`` failed; ``kind`` is one of protocol.md's kinds (``not_found``, ...).

    Resident models are untouched.
    """

    code = -32002

    @property
    def kind(self) -> str | None:
        return (self.data or {}).get("kind")

    @property
    def detail(self) -> str | None:
        return (self.data or {}).get("detail")


class BusyError(WorkerError):
    """-32003: the worker's queue is full; retry later."""

    code = -32003


class ContextOverflowError(WorkerError):
    """-32004: the prompt is longer than the context limit."""

    code = -32004


class GenerationFailedError(WorkerError):
    """-32005: generation failed inside MLX."""

    code = -32005


class MemoryBudgetError(WorkerError):
    """-32006: the request's KV cache and activations do not fit the memory MLX has left;
    ``data`` says what it needs, what is left and how many tokens fit."""

    code = -32006


class RequestCancelledError(WorkerError):
    """-32800: a request other than ``generate`` was cancelled before it ran."""

    code = -32800


#: The class of each error code of the contract (``tests/test_types.py`` checks it against the
#: schema's ``errors`` index).
ERROR_CLASSES: dict[int, type[WorkerError]] = {
    cls.code: cls
    for cls in (
        ParseError,
        InvalidRequestError,
        MethodNotFoundError,
        InvalidParamsError,
        InternalError,
        NoModelError,
        LoadFailedError,
        BusyError,
        ContextOverflowError,
        GenerationFailedError,
        MemoryBudgetError,
        RequestCancelledError,
    )
}


def error_from_response(error: dict[str, Any]) -> WorkerError:
    """The exception for a response's ``error`` member."""
    code = int(error.get("code", 0))
    cls = ERROR_CLASSES.get(code, WorkerError)
    return cls(code, str(error.get("message", "")), error.get("data"))
