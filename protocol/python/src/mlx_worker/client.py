"""The blocking client: one ``mlx-worker`` child process, a reader thread, typed results."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from typing import Any, Callable, Iterator, Sequence, cast

from . import _types as t
from ._core import Router, StderrTail, drop_none, find_binary, track
from .errors import MLXWorkerError, WorkerDiedError

#: How long ``close`` waits for the worker to exit after its stdin closes, then after SIGTERM.
EXIT_WAIT_S = 5.0


class _Call:
    """What one request waits on: the messages routed to its id, in order."""

    def __init__(self) -> None:
        self.messages: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()

    def __call__(self, kind: str, payload: Any) -> None:
        self.messages.put((kind, payload))


class Generation(Iterator["t.GenerateDelta"]):
    """A running ``generate``: iterate for its ``generate/delta`` params (``delta["text"]`` is
    the new text); the iteration ends with the result, which is then :attr:`result` (and the
    ``StopIteration`` value, so ``result = yield from client.generate(...)`` works)."""

    def __init__(self, client: Client, request_id: int, call: _Call) -> None:
        self._client = client
        self.request_id = request_id
        self._call = call
        self.result: t.GenerateResult | None = None
        self._error: BaseException | None = None

    def __next__(self) -> t.GenerateDelta:
        delta = self.poll(None)
        if delta is None:
            raise StopIteration(self.result)
        return delta

    def poll(self, timeout: float | None) -> t.GenerateDelta | None:
        """The next delta within ``timeout`` seconds (None: wait); ``None`` when the generation
        is over (then :attr:`result` is set) or nothing came in time (check :attr:`done`)."""
        if self.done:
            if self._error is not None:
                raise self._error
            return None
        try:
            kind, payload = self._call.messages.get(timeout=timeout)
        except queue.Empty:
            return None
        if kind == "delta":
            return cast(t.GenerateDelta, payload)
        if kind == "result":
            self.result = cast(t.GenerateResult, payload)
            return None
        self._error = payload
        raise payload

    @property
    def done(self) -> bool:
        """The response has arrived (a result or an error)."""
        return self.result is not None or self._error is not None

    def finish(self) -> t.GenerateResult:
        """Reads the remaining deltas and returns the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def cancel(self) -> bool:
        """Asks the worker to stop this generation; it still answers, ``finish_reason`` is
        ``"cancelled"``. Returns whether the worker knew the request."""
        if self.done:
            return False
        return bool(self._client.cancel(self.request_id)["cancelled"])


class Client:
    """An ``mlx-worker`` child process and a typed call for every method of protocol.md.

    The binary is ``binary``, else ``$MLX_WORKER_BIN``, else ``mlx-worker`` on PATH. The worker
    starts at once; a dead one (see :class:`~mlx_worker.errors.WorkerDiedError`) is replaced by
    the next :meth:`load`. Use as a context manager, or call :meth:`close`; at interpreter exit
    the worker's stdin is closed, so it finishes and exits. Thread-safe: calls may come from any
    thread, and a ``cancel`` from one thread reaches a ``generate`` running in another.
    """

    def __init__(
        self,
        binary: str | os.PathLike[str] | None = None,
        *,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        stderr: Callable[[str], None] | None = None,
    ) -> None:
        self.binary = find_binary(binary)
        self._args = list(args)
        self._env = env
        self._on_stderr = stderr
        self._write_lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._start()
        track(self)

    # -- process ---------------------------------------------------------------------------

    def _start(self) -> None:
        self._router = Router()
        self._tail = StderrTail()
        self._died: WorkerDiedError | None = None
        proc = subprocess.Popen(
            [self.binary, *self._args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env,
        )
        self._proc = proc
        self._stderr_thread = threading.Thread(
            target=self._read_stderr, args=(proc, self._tail), name="mlx-worker-stderr", daemon=True
        )
        self._stderr_thread.start()
        threading.Thread(
            target=self._read_stdout,
            args=(proc, self._router, self._tail, self._stderr_thread),
            name="mlx-worker-stdout",
            daemon=True,
        ).start()

    def _read_stderr(self, proc: subprocess.Popen[bytes], tail: StderrTail) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            tail.add(line)
            if self._on_stderr is not None:
                self._on_stderr(line.decode("utf-8", "replace").rstrip("\n"))

    def _read_stdout(
        self,
        proc: subprocess.Popen[bytes],
        router: Router,
        tail: StderrTail,
        stderr_thread: threading.Thread,
    ) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            router.route(line)
        returncode = proc.wait()
        stderr_thread.join(timeout=1.0)
        died = WorkerDiedError(returncode, tail.text())
        if proc is self._proc:
            self._died = died
        router.fail_all(died)

    @property
    def pid(self) -> int | None:
        """The worker's process id."""
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        """The worker runs and its stdout is open."""
        return self._proc is not None and self._proc.poll() is None and self._died is None

    def stderr_tail(self) -> str:
        """The last lines of the worker's log."""
        return self._tail.text()

    def _close_stdin(self) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None and not proc.stdin.closed:
            with self._write_lock:
                proc.stdin.close()

    def close(self, timeout: float = EXIT_WAIT_S) -> int | None:
        """Closes the worker's stdin (it finishes what it received, then exits 0), waits up to
        ``timeout`` s, then terminates it. Returns its exit status."""
        proc = self._proc
        if proc is None:
            return None
        try:
            self._close_stdin()
        except OSError:
            pass
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                return proc.wait(EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls ------------------------------------------------------------------------------

    def _send(self, method: str, params: dict[str, Any] | None) -> tuple[int, _Call]:
        if self._died is not None:
            raise self._died
        call = _Call()
        request_id = self._router.open(call)
        line = Router.line(request_id, method, params)
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        try:
            with self._write_lock:
                proc.stdin.write(line)
                proc.stdin.flush()
        except (OSError, ValueError) as e:
            self._router.close(request_id)
            # The reader thread reports the death; wait a moment for its account.
            proc.wait(timeout=EXIT_WAIT_S)
            self._stderr_thread.join(timeout=1.0)
            raise self._died or WorkerDiedError(proc.poll(), self._tail.text()) from e
        return request_id, call

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        on_progress: Callable[[t.LoadProgress], None] | None = None,
    ) -> Any:
        """Sends one request and waits for its result (raises its error). ``on_progress`` gets
        its ``load/progress`` params, on this thread."""
        _, call = self._send(method, params)
        while True:
            kind, payload = call.messages.get()
            if kind == "result":
                return payload
            if kind == "progress":
                if on_progress is not None:
                    on_progress(cast(t.LoadProgress, payload))
            elif kind != "delta":
                raise payload

    def initialize(self, **params: Any) -> t.InitializeResult:
        """``initialize``: the worker's version, MLX device and capabilities."""
        return cast(t.InitializeResult, self.call("initialize", drop_none(params)))

    def load(
        self,
        model: str,
        *,
        on_progress: Callable[[t.LoadProgress], None] | None = None,
        **params: Any,
    ) -> t.LoadResult:
        """``load``: makes ``model`` resident and active (other params: protocol.md's table).
        Starts a fresh worker first when the last one died."""
        if self._died is not None or (self._proc is not None and self._proc.poll() is not None):
            self._start()
        request = drop_none({"model": model, **params})
        return cast(t.LoadResult, self.call("load", request, on_progress=on_progress))

    def generate(self, messages: list[t.ChatMessage] | list[dict[str, Any]], **params: Any) -> Generation:
        """``generate``: returns at once; iterate the :class:`Generation` for its deltas."""
        request_id, call = self._send("generate", drop_none({"messages": messages, **params}))
        return Generation(self, request_id, call)

    def cancel(self, request_id: t.RequestId) -> t.CancelResult:
        """``cancel``: stops a queued or running request."""
        return cast(t.CancelResult, self.call("cancel", {"request_id": request_id}))

    def unload(self, model: str | None = None) -> t.UnloadResult:
        """``unload``: one model, or all."""
        return cast(t.UnloadResult, self.call("unload", drop_none({"model": model})))

    def reset(self, *, prompt_cache: bool = True) -> t.ResetResult:
        """``reset``: clears MLX's buffer cache and, unless ``prompt_cache=False``, the prompt
        caches."""
        # Sent only when false: a worker older than the field refuses it.
        return cast(t.ResetResult, self.call("reset", {} if prompt_cache else {"prompt_cache": False}))

    def status(self) -> t.StatusResult:
        """``status``: state, resident models, queue, memory."""
        return cast(t.StatusResult, self.call("status", {}))

    def cache_list(self, model: str | None = None) -> t.CacheListResult:
        """``cache_list``: the conversations a model keeps caches for, in memory and on disk."""
        return cast(t.CacheListResult, self.call("cache_list", drop_none({"model": model})))

    def cache_pin(self, conversation_id: str, *, pinned: bool = True, model: str | None = None) -> t.CachePinResult:
        """``cache_pin``: keeps a conversation in memory past the budget (``pinned=False``: lets it go)."""
        params = drop_none({"model": model, "conversation_id": conversation_id, "pinned": pinned})
        return cast(t.CachePinResult, self.call("cache_pin", params))

    def cache_fork(
        self, conversation_id: str, new_conversation_id: str, *, tokens: int | None = None, model: str | None = None
    ) -> t.CacheForkResult:
        """``cache_fork``: a new conversation from the first ``tokens`` (default all) of another."""
        params = {"model": model, "conversation_id": conversation_id, "new_conversation_id": new_conversation_id, "tokens": tokens}
        return cast(t.CacheForkResult, self.call("cache_fork", drop_none(params)))

    def cache_evict(self, conversation_id: str | None = None, *, model: str | None = None) -> t.CacheEvictResult:
        """``cache_evict``: forgets one conversation, or all of the model's, in memory and on disk."""
        params = drop_none({"model": model, "conversation_id": conversation_id})
        return cast(t.CacheEvictResult, self.call("cache_evict", params))

    def tokenize(self, **params: Any) -> t.TokenizeResult:
        """``tokenize``: ``text=`` or ``messages=`` (then the chat template applies)."""
        return cast(t.TokenizeResult, self.call("tokenize", drop_none(params)))

    def shutdown(self, timeout: float = EXIT_WAIT_S) -> int | None:
        """``shutdown``: the worker answers after what it received, then exits; returns its exit
        status."""
        try:
            self.call("shutdown", {})
        except MLXWorkerError:
            pass
        return self.close(timeout)
