"""The asyncio client: the same calls as :class:`mlx_worker.Client`, awaited."""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any, AsyncIterator, Callable, Sequence, cast

from . import _types as t
from ._core import Router, StderrTail, drop_none, find_binary, track
from .client import EXIT_WAIT_S
from .errors import MLXWorkerError, WorkerDiedError

# A line of the worker's stdout may be long (a load result carries the chat template's text).
_LINE_LIMIT = 64 * 1024 * 1024


class AsyncGeneration(AsyncIterator["t.GenerateDelta"]):
    """A running ``generate``: ``async for`` its deltas; then :attr:`result` holds the result
    (:meth:`finish` reads what is left and returns it)."""

    def __init__(self, client: AsyncClient, request_id: int, messages: asyncio.Queue[tuple[str, Any]]):
        self._client = client
        self.request_id = request_id
        self._messages = messages
        self.result: t.GenerateResult | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        """The response has arrived (a result or an error)."""
        return self.result is not None or self._error is not None

    async def __anext__(self) -> t.GenerateDelta:
        if self._error is not None:
            raise self._error
        if self.result is not None:
            raise StopAsyncIteration
        kind, payload = await self._messages.get()
        if kind == "delta":
            return cast(t.GenerateDelta, payload)
        if kind == "result":
            self.result = cast(t.GenerateResult, payload)
            raise StopAsyncIteration
        self._error = payload
        raise payload

    async def finish(self) -> t.GenerateResult:
        """Reads the remaining deltas and returns the result."""
        async for _ in self:
            pass
        assert self.result is not None
        return self.result

    async def cancel(self) -> bool:
        """Asks the worker to stop this generation (it still answers, ``"cancelled"``)."""
        if self.done:
            return False
        return bool((await self._client.cancel(self.request_id))["cancelled"])


class AsyncClient:
    """An ``mlx-worker`` child process driven from asyncio. Create with ``await
    AsyncClient.start(...)`` (or ``async with AsyncClient(...)``); the binary is found as
    :class:`mlx_worker.Client` finds it, and a dead worker is replaced by the next :meth:`load`."""

    def __init__(
        self,
        binary: str | os.PathLike[str] | None = None,
        *,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.binary = find_binary(binary)
        self._args = list(args)
        self._env = env
        self._proc: asyncio.subprocess.Process | None = None
        self._died: WorkerDiedError | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._tail = StderrTail()
        self._router = Router()

    @classmethod
    async def start(cls, binary: str | os.PathLike[str] | None = None, **kwargs: Any) -> AsyncClient:
        """A client whose worker runs."""
        client = cls(binary, **kwargs)
        await client._start()
        return client

    async def _start(self) -> None:
        self._router = Router()
        self._tail = StderrTail()
        self._died = None
        proc = await asyncio.create_subprocess_exec(
            self.binary,
            *self._args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env,
            limit=_LINE_LIMIT,
        )
        self._proc = proc
        stderr_task = asyncio.ensure_future(self._read_stderr(proc, self._tail))
        reader = asyncio.ensure_future(self._read_stdout(proc, self._router, self._tail, stderr_task))
        self._tasks |= {stderr_task, reader}
        for task in (stderr_task, reader):
            task.add_done_callback(self._tasks.discard)
        track(self)

    @staticmethod
    async def _read_stderr(proc: asyncio.subprocess.Process, tail: StderrTail) -> None:
        assert proc.stderr is not None
        async for line in proc.stderr:
            tail.add(line)

    async def _read_stdout(
        self,
        proc: asyncio.subprocess.Process,
        router: Router,
        tail: StderrTail,
        stderr_task: asyncio.Future[None],
    ) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            router.route(line)
        returncode = await proc.wait()
        try:
            await asyncio.wait_for(asyncio.shield(stderr_task), 1.0)
        except asyncio.TimeoutError:
            pass
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
        return self._proc is not None and self._proc.returncode is None and self._died is None

    def stderr_tail(self) -> str:
        """The last lines of the worker's log."""
        return self._tail.text()

    def _close_stdin(self) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()

    async def close(self, timeout: float = EXIT_WAIT_S) -> int | None:
        """Closes the worker's stdin, waits up to ``timeout`` s for it to exit, then terminates
        it. Returns its exit status."""
        proc = self._proc
        if proc is None:
            return None
        self._close_stdin()
        try:
            return await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            proc.terminate()
            try:
                return await asyncio.wait_for(proc.wait(), EXIT_WAIT_S)
            except asyncio.TimeoutError:
                proc.kill()
                return await proc.wait()

    async def __aenter__(self) -> AsyncClient:
        if self._proc is None:
            await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- calls ------------------------------------------------------------------------------

    async def _send(self, method: str, params: dict[str, Any] | None) -> tuple[int, asyncio.Queue[tuple[str, Any]]]:
        if self._proc is None:
            await self._start()
        if self._died is not None:
            raise self._died
        messages: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        request_id = self._router.open(lambda kind, payload: messages.put_nowait((kind, payload)))
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        try:
            proc.stdin.write(Router.line(request_id, method, params))
            await proc.stdin.drain()
        except (OSError, RuntimeError) as e:
            self._router.close(request_id)
            await asyncio.wait_for(proc.wait(), EXIT_WAIT_S)
            raise self._died or WorkerDiedError(proc.returncode, self._tail.text()) from e
        return request_id, messages

    async def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        on_progress: Callable[[t.LoadProgress], Any] | None = None,
    ) -> Any:
        """Sends one request and awaits its result (raises its error). ``on_progress`` gets its
        ``load/progress`` params (a coroutine it returns is awaited)."""
        _, messages = await self._send(method, params)
        while True:
            kind, payload = await messages.get()
            if kind == "result":
                return payload
            if kind == "progress":
                if on_progress is not None:
                    outcome = on_progress(cast(t.LoadProgress, payload))
                    if asyncio.iscoroutine(outcome):
                        await outcome
            elif kind != "delta":
                raise payload

    async def initialize(self, **params: Any) -> t.InitializeResult:
        """``initialize``."""
        return cast(t.InitializeResult, await self.call("initialize", drop_none(params)))

    async def load(
        self,
        model: str,
        *,
        on_progress: Callable[[t.LoadProgress], Any] | None = None,
        **params: Any,
    ) -> t.LoadResult:
        """``load``; starts a fresh worker first when the last one died."""
        if self._died is not None or (self._proc is not None and self._proc.returncode is not None):
            await self._start()
        request = drop_none({"model": model, **params})
        return cast(t.LoadResult, await self.call("load", request, on_progress=on_progress))

    async def generate(self, messages: list[t.ChatMessage] | list[dict[str, Any]], **params: Any) -> AsyncGeneration:
        """``generate``: returns once sent; ``async for`` the generation's deltas."""
        request_id, queue = await self._send("generate", drop_none({"messages": messages, **params}))
        return AsyncGeneration(self, request_id, queue)

    async def cancel(self, request_id: t.RequestId) -> t.CancelResult:
        """``cancel``."""
        return cast(t.CancelResult, await self.call("cancel", {"request_id": request_id}))

    async def unload(self, model: str | None = None) -> t.UnloadResult:
        """``unload``: one model, or all."""
        return cast(t.UnloadResult, await self.call("unload", drop_none({"model": model})))

    async def reset(self, *, prompt_cache: bool = True) -> t.ResetResult:
        """``reset``: clears MLX's buffer cache and, unless ``prompt_cache=False``, the prompt
        caches."""
        params = {} if prompt_cache else {"prompt_cache": False}  # an older worker refuses it
        return cast(t.ResetResult, await self.call("reset", params))

    async def status(self) -> t.StatusResult:
        """``status``."""
        return cast(t.StatusResult, await self.call("status", {}))

    async def cache_list(self, model: str | None = None) -> t.CacheListResult:
        """``cache_list``."""
        return cast(t.CacheListResult, await self.call("cache_list", drop_none({"model": model})))

    async def cache_pin(self, conversation_id: str, *, pinned: bool = True, model: str | None = None) -> t.CachePinResult:
        """``cache_pin``."""
        params = drop_none({"model": model, "conversation_id": conversation_id, "pinned": pinned})
        return cast(t.CachePinResult, await self.call("cache_pin", params))

    async def cache_fork(
        self, conversation_id: str, new_conversation_id: str, *, tokens: int | None = None, model: str | None = None
    ) -> t.CacheForkResult:
        """``cache_fork``."""
        params = {"model": model, "conversation_id": conversation_id, "new_conversation_id": new_conversation_id, "tokens": tokens}
        return cast(t.CacheForkResult, await self.call("cache_fork", drop_none(params)))

    async def cache_evict(self, conversation_id: str | None = None, *, model: str | None = None) -> t.CacheEvictResult:
        """``cache_evict``."""
        params = drop_none({"model": model, "conversation_id": conversation_id})
        return cast(t.CacheEvictResult, await self.call("cache_evict", params))

    async def tokenize(self, **params: Any) -> t.TokenizeResult:
        """``tokenize``: ``text=`` or ``messages=``."""
        return cast(t.TokenizeResult, await self.call("tokenize", drop_none(params)))

    async def shutdown(self, timeout: float = EXIT_WAIT_S) -> int | None:
        """``shutdown``, then the worker's exit status."""
        try:
            await self.call("shutdown", {})
        except MLXWorkerError:
            pass
        return await self.close(timeout)
