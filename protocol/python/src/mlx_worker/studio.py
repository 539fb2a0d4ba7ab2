"""Unsloth Studio on mlx-worker.

:class:`MLXInferenceBackend` has the public surface of Studio's ``MLXInferenceBackend`` (the
seed, ``studio/backend/core/inference/mlx_inference.py``), so Studio swaps one import::

    # from core.inference.mlx_inference import MLXInferenceBackend
    from mlx_worker.studio import MLXInferenceBackend
    backend = MLXInferenceBackend()          # finds mlx-worker: MLX_WORKER_BIN or PATH

:class:`Bridge` speaks the dicts Studio's orchestrator exchanges with its inference process
(commands in, replies out), so the orchestrator can drive the Rust worker with no Python
inference process in between.
"""

from __future__ import annotations

import base64
import io
import os
import queue
import threading
import time
import traceback
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator

from . import _types as t
from ._core import find_binary
from .client import Client, Generation
from .errors import MLXWorkerError, NoModelError, WorkerDiedError

# How often the generator and the cancel watcher look at `cancel_event` (seconds): the
# generator ends within 100 ms of the event being set, the worker hears of it at once.
_POLL_S = 0.02


def _studio_timings(result: t.GenerateResult) -> dict[str, Any]:
    """llama-server's timings, as Studio reads them, from a `generate` result."""
    timings, usage = result["timings"], result["usage"]

    def per_token(ms: float, n: int) -> float:
        return ms / n if n else 0.0

    return {
        "prompt_n": timings["prompt_n"],
        "prompt_ms": timings["prompt_ms"],
        "prompt_per_token_ms": per_token(timings["prompt_ms"], timings["prompt_n"]),
        "prompt_per_second": timings["prompt_per_second"],
        "predicted_n": timings["predicted_n"],
        "predicted_ms": timings["predicted_ms"],
        "predicted_per_token_ms": per_token(timings["predicted_ms"], timings["predicted_n"]),
        "predicted_per_second": timings["predicted_per_second"],
        "cache_n": usage["cached_tokens"],
    }


def generation_stats(result: t.GenerateResult) -> dict[str, Any]:
    """Studio's ``stats``: ``usage`` and llama-server ``timings``."""
    usage = result["usage"]
    return {
        "usage": {
            "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
        },
        "timings": _studio_timings(result),
    }


def image_to_wire(image: Any) -> str | None:
    """An image as the worker takes it: a PIL image or bytes become base64 (PNG for PIL), an
    existing path stays a path, other text is passed as base64 or a data URL."""
    if image is None:
        return None
    if isinstance(image, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(image)).decode("ascii")
    if isinstance(image, os.PathLike):
        return os.fspath(image)
    if isinstance(image, str):
        return image
    if hasattr(image, "save"):  # a PIL image, without importing PIL
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return base64.b64encode(buffer.getvalue()).decode("ascii")
    raise TypeError(f"image must be a PIL image, bytes, base64 text or a path, not {type(image)!r}")


def _dtype_name(dtype: Any) -> str | None:
    """``"bfloat16"`` from ``"bfloat16"``, ``torch.bfloat16`` or ``mx.bfloat16``; None else."""
    if dtype is None:
        return None
    name = str(dtype).rsplit(".", 1)[-1]
    return name if name in ("bfloat16", "float16", "float32") else None


def studio_model_info(identifier: str, loaded: t.LoadResult, override_requested: bool) -> dict[str, Any]:
    """``model_info`` of Studio's ``loaded`` reply, from a ``load`` result."""
    info = loaded["info"]
    template = info["chat_template"]
    kv = info["kv_quantization"]
    eligibility = None
    if kv.get("requested") is not None:
        eligibility = "eligible" if kv.get("applied") is not None else "ineligible"
    return {
        "identifier": identifier,
        "display_name": info["display_name"],
        "is_vision": info["is_vision"],
        "is_lora": info["is_lora"],
        "is_gguf": False,
        "is_mlx": True,
        "is_audio": False,
        "audio_type": None,
        "has_audio_input": False,
        "context_length": info["context_length"],
        "mlx_kv_bits": kv.get("applied"),
        "mlx_kv_bits_requested": kv.get("requested"),
        "mlx_kv_quant_eligibility": eligibility,
        "mlx_kv_quant_reason": kv.get("reason"),
        "chat_template_override_requested": override_requested,
        "chat_template_info": {
            "has_template": template["present"],
            "template": template.get("text"),
            "format_type": "jinja" if template["present"] else None,
            "template_name": template["source"],
            "special_tokens": dict(info["special_tokens"]),
        },
    }


class MLXInferenceBackend:
    """Studio's MLX backend on mlx-worker: the seed's attributes and methods, one worker process
    underneath (started by the first ``load_model``, replaced after a crash by the next one).

    ``binary`` is the worker (else ``$MLX_WORKER_BIN``, else ``mlx-worker`` on PATH).
    ``launch``, when given, is the command that starts the worker as a group of ranks (the
    worker and its args follow it), e.g. ``["mlx.launch", "--backend", "ring", "--hosts",
    "10.0.0.1,10.0.0.2", "--"]``: then a load with ``mlx_distributed`` and
    ``mlx_parallel_mode`` (Studio's settings) splits the model over the ranks.
    """

    def __init__(
        self,
        binary: str | os.PathLike[str] | None = None,
        *,
        worker_args: Iterable[str] = (),
        launch: Iterable[str] = (),
    ):
        self.models: dict[str, dict[str, Any]] = {}
        self.active_model_name: str | None = None
        self.loading_models: set[str] = set()
        self.loaded_local_models: list[str] = []
        self.device = "mlx"
        #: ``{"usage", "timings"}`` of the last finished generation (Studio's ``stats``).
        self.last_generation_stats: dict[str, Any] | None = None
        #: The last generation's whole ``generate`` result (``finish_reason`` included).
        self.last_generation_result: t.GenerateResult | None = None
        self._binary = binary
        self._worker_args = list(worker_args)
        self._launch = list(launch)
        self._client: Client | None = None
        # Set once the worker has answered the last generation.
        self._generation_done = threading.Event()
        self._generation_done.set()

    # -- the worker -------------------------------------------------------------------------

    @property
    def client(self) -> Client:
        """The worker's client (started on first use)."""
        if self._client is None:
            if self._launch:
                worker = [find_binary(self._binary), *self._worker_args]
                self._client = Client(self._launch[0], args=[*self._launch[1:], *worker])
            else:
                self._client = Client(self._binary, args=self._worker_args)
        return self._client

    def _forget_models(self) -> None:
        """The worker died: nothing is resident any more."""
        self.models.clear()
        self.active_model_name = None

    def close(self) -> None:
        """Stops the worker."""
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- load / unload ----------------------------------------------------------------------

    def load_model(
        self,
        config: Any,
        max_seq_length: int = 2048,
        load_in_4bit: bool = True,
        hf_token: str | None = None,
        trust_remote_code: bool = False,
        gpu_ids: Any = None,
        dtype: Any = None,
        *,
        kv_bits: int | None = None,
        chat_template_override: str | None = None,
        on_progress: Callable[[t.LoadProgress], None] | None = None,
    ) -> bool:
        """Loads ``config.identifier`` (or ``config`` itself as a name) and makes it active.

        ``config`` may carry ``is_vision``, ``is_lora``, ``is_gguf`` (hints; the worker detects
        each), ``base_model`` (with ``is_lora``: the adapter's base), ``kv_bits`` /
        ``mlx_kv_bits``, ``chat_template_override``, and ``mlx_distributed`` with
        ``mlx_parallel_mode`` (``"tensor"`` or ``"pipeline"``: the model split over the ranks of
        a worker started through ``launch``). ``hf_token`` goes to the worker's hub
        client only, never into ``os.environ``. Raises
        :class:`~mlx_worker.errors.LoadFailedError` (with ``kind``) on failure, leaving the
        models already loaded as they were. ``gpu_ids`` is accepted and ignored (MLX has one
        device).
        """
        del gpu_ids
        model_name = config.identifier if hasattr(config, "identifier") else str(config)
        if getattr(config, "audio_type", None):
            raise MLXWorkerError(
                f"cannot load {model_name!r}: audio models are not supported by mlx-worker"
            )
        if kv_bits is None:
            kv_bits = getattr(config, "kv_bits", None) or getattr(config, "mlx_kv_bits", None)
        if chat_template_override is None:
            chat_template_override = getattr(config, "chat_template_override", None)
        params: dict[str, Any] = {
            "max_seq_length": max_seq_length or 0,
            "load_in_4bit": bool(load_in_4bit),
            "hf_token": hf_token or None,
            "trust_remote_code": bool(trust_remote_code),
            "dtype": _dtype_name(dtype),
            "is_vision": getattr(config, "is_vision", None),
            "is_lora": getattr(config, "is_lora", None),
            "is_gguf": getattr(config, "is_gguf", None),
            "kv_bits": kv_bits,
            "chat_template_override": chat_template_override,
        }
        if getattr(config, "mlx_distributed", False) and getattr(config, "mlx_parallel_mode", None):
            params["parallel"] = config.mlx_parallel_mode
        model = model_name
        base_model = getattr(config, "base_model", None)
        if getattr(config, "is_lora", False) and base_model:
            model, params["adapter"] = base_model, model_name
        if self._client is not None and not self._client.alive:
            self._forget_models()  # it died since: the next load starts a fresh one
        self.loading_models.add(model_name)
        try:
            try:
                loaded = self.client.load(model, on_progress=on_progress, **params)
            except WorkerDiedError:
                self._forget_models()
                raise
        finally:
            self.loading_models.discard(model_name)
        info = loaded["info"]
        self.models[model_name] = {
            "model_id": loaded["model_id"],
            "is_vision": info["is_vision"],
            "is_lora": info["is_lora"],
            "is_audio": False,
            "audio_type": None,
            "has_audio_input": False,
            "model_info": studio_model_info(model_name, loaded, chat_template_override is not None),
            "load_result": loaded,
        }
        if os.path.isdir(model_name) and model_name not in self.loaded_local_models:
            self.loaded_local_models.append(model_name)
        self.active_model_name = model_name
        return True

    def unload_model(self, model_name: str) -> bool:
        """Unloads ``model_name`` (the worker frees its memory)."""
        entry = self.models.pop(model_name, None)
        if entry is not None and self._client is not None and self._client.alive:
            still_used = any(m["model_id"] == entry["model_id"] for m in self.models.values())
            if not still_used:
                try:
                    self._client.unload(entry["model_id"])
                except NoModelError:
                    pass
        if self.active_model_name == model_name:
            self.active_model_name = None
        return True

    def reset_generation_state(self) -> None:
        """Clears the worker's MLX buffer cache and prompt caches."""
        if self._client is not None and self._client.alive:
            self._client.reset()

    # -- generate ---------------------------------------------------------------------------

    def generate_chat_response(
        self,
        messages: list[dict[str, Any]],
        system_prompt: str = "",
        image: Any = None,
        temperature: float = 0.7,
        top_p: float = 0.9,
        top_k: int = 40,
        min_p: float = 0.0,
        max_new_tokens: int = 256,
        repetition_penalty: float = 1.0,
        cancel_event: Any = None,
        *,
        presence_penalty: float = 0.0,
        tools: list[dict[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        reasoning_effort: str | None = None,
        preserve_thinking: bool | None = None,
        continue_final_message: bool = False,
        use_adapter: bool | None = None,
        **extra: Any,
    ) -> Iterator[str]:
        """Yields the answer so far (cumulative text, only ever growing).

        ``cancel_event`` (a ``threading.Event`` or a ``multiprocessing`` Event): once set, the
        worker is told at once (mid-prefill too) and this generator ends within 100 ms.
        ``extra`` takes the protocol's other ``generate`` params (``seed``, ``stop``, ...).
        """
        if self.active_model_name is None or self._client is None:
            raise RuntimeError("No model loaded")
        entry = self.models[self.active_model_name]
        if repetition_penalty is None or float(repetition_penalty) in (0.0, 1.0):
            repetition_penalty = 1.0  # 0 and 1 both mean off, as in the seed
        params: dict[str, Any] = {
            "model": entry["model_id"],
            "system_prompt": system_prompt or "",
            "temperature": float(temperature),
            "top_p": float(top_p),
            "top_k": int(top_k or 0),
            "min_p": float(min_p or 0.0),
            "max_new_tokens": int(max_new_tokens),
            "repetition_penalty": float(repetition_penalty),
            "presence_penalty": float(presence_penalty or 0.0),
            "tools": tools,
            "enable_thinking": enable_thinking,
            "reasoning_effort": reasoning_effort,
            "preserve_thinking": preserve_thinking,
            "continue_final_message": bool(continue_final_message),
            "use_adapter": use_adapter,
            **extra,
        }
        # As the seed: an image goes to a vision model, a text model never sees it.
        if entry["is_vision"] and image is not None:
            params["image"] = image_to_wire(image)
        self.last_generation_stats = None
        self.last_generation_result = None
        yield from self._stream(self._client, list(messages), params, cancel_event)

    def _stream(
        self, client: Client, messages: list[dict[str, Any]], params: dict[str, Any], cancel_event: Any
    ) -> Iterator[str]:
        done = self._generation_done = threading.Event()
        try:
            generation = client.generate(messages, **params)
        except WorkerDiedError:
            done.set()
            self._forget_models()
            raise
        stop_watching = threading.Event()
        if cancel_event is not None:
            threading.Thread(
                target=self._watch_cancel,
                args=(generation, cancel_event, stop_watching),
                name="mlx-worker-cancel",
                daemon=True,
            ).start()
        text = ""
        finished = False
        try:
            while True:
                if cancel_event is not None and cancel_event.is_set():
                    break
                delta = generation.poll(_POLL_S if cancel_event is not None else None)
                if delta is not None:
                    if delta["text"]:
                        text += delta["text"]
                        yield text
                elif generation.done:
                    finished = True
                    self._record(generation)
                    break
        except WorkerDiedError:
            self._forget_models()
            raise
        finally:
            stop_watching.set()
            if not finished:
                # Cancelled, or the caller stopped reading: the worker stops, its answer is
                # recorded when it comes, without holding up the caller.
                threading.Thread(
                    target=self._finish_abandoned, args=(generation, done), name="mlx-worker-finish", daemon=True
                ).start()
            else:
                done.set()

    @staticmethod
    def _watch_cancel(generation: Generation, cancel_event: Any, stop: threading.Event) -> None:
        while not stop.is_set() and not generation.done:
            if cancel_event.wait(_POLL_S):
                try:
                    generation.cancel()
                except MLXWorkerError:
                    pass
                return

    def _finish_abandoned(self, generation: Generation, done: threading.Event) -> None:
        try:
            if not generation.done:
                generation.cancel()
            generation.finish()
            if done is self._generation_done:
                self._record(generation)
        except MLXWorkerError:
            pass
        finally:
            done.set()

    def _record(self, generation: Generation) -> None:
        assert generation.result is not None
        self.last_generation_result = generation.result
        self.last_generation_stats = generation_stats(generation.result)

    def wait_for_generation(self, timeout: float | None = None) -> bool:
        """Waits until the worker has answered the last generation (a cancelled one's answer
        comes after the generator ended); returns whether it has."""
        return self._generation_done.wait(timeout)

    def generate_with_adapter_control(
        self, use_adapter: bool | None = None, cancel_event: Any = None, **gen_kwargs: Any
    ) -> Iterator[str]:
        """:meth:`generate_chat_response` with ``use_adapter``: ``False`` answers with the base
        weights although a LoRA adapter is loaded (no reload)."""
        yield from self.generate_chat_response(cancel_event=cancel_event, use_adapter=use_adapter, **gen_kwargs)


# -- the bridge -------------------------------------------------------------------------------

#: The members of Studio's generate command that map onto `generate_chat_response` as they are.
_GENERATE_FIELDS = (
    "messages", "system_prompt", "temperature", "top_p", "top_k", "min_p", "max_new_tokens",
    "repetition_penalty", "presence_penalty", "use_adapter", "tools", "enable_thinking",
    "reasoning_effort", "preserve_thinking", "continue_final_message",
)  # fmt: skip

_SHUTDOWN = object()

#: While a load runs, the bridge sends a ``status`` reply at least this often (seconds): Studio's
#: orchestrator gives up on a load after 300 s without one.
HEARTBEAT_S = 30.0


class Bridge:
    """Studio's inference-process protocol on mlx-worker: :meth:`send` command dicts (as the
    orchestrator puts them on its command queue), read reply dicts with :meth:`get` or by
    iterating (as it reads its reply queue). Every reply carries ``ts``.

    Commands: ``load`` (Studio's load settings: ``model_name``, ``max_seq_length``,
    ``load_in_4bit``, ``hf_token``, ``trust_remote_code``, ``mlx_kv_bits``,
    ``chat_template_override``, ``is_vision``, ``is_lora``, ``base_model``, ``is_gguf``,
    ``audio_type``, ``mlx_distributed``, ``mlx_parallel_mode``), ``generate``, ``cancel``, ``unload``, ``reset``, ``status``, ``shutdown``.
    ``cancel`` acts at once (as Studio's shared cancel event); ``unload`` answers the generates
    still queued before it ``gen_done`` with ``cancelled: true``. Anything else is passed to the
    worker as a method (Studio's audio commands are answered with the worker's "audio is not
    supported") and a failure is an ``error`` reply.
    """

    def __init__(self, binary: str | os.PathLike[str] | None = None, *, backend: MLXInferenceBackend | None = None):
        self.backend = backend or MLXInferenceBackend(binary)
        self._commands: queue.Queue[Any] = queue.Queue()
        self._replies: queue.Queue[Any] = queue.Queue()
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._sent = 0  # commands sent so far
        self._unload_mark = 0  # generates sent before this unload are skipped
        self._thread = threading.Thread(target=self._run, name="mlx-worker-bridge", daemon=True)
        self._thread.start()

    def send(self, command: dict[str, Any]) -> None:
        """Queues a command (``cancel`` takes effect at once)."""
        kind = command.get("type")
        with self._lock:
            self._sent += 1
            if kind == "cancel":
                self._cancel.set()
                return
            if kind == "unload":
                self._unload_mark = self._sent
            self._commands.put((self._sent, command))

    def get(self, timeout: float | None = None) -> dict[str, Any]:
        """The next reply (``queue.Empty`` after ``timeout`` s)."""
        reply = self._replies.get(timeout=timeout)
        if reply is _SHUTDOWN:
            self._replies.put(_SHUTDOWN)
            raise EOFError("the bridge has shut down")
        return reply

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Replies until ``shutdown``."""
        while True:
            try:
                yield self.get()
            except EOFError:
                return

    def close(self) -> None:
        """Sends ``shutdown`` and waits for the bridge to stop."""
        if self._thread.is_alive():
            self.send({"type": "shutdown"})
            self._thread.join()

    def _reply(self, message: dict[str, Any]) -> None:
        self._replies.put({**message, "ts": time.time()})

    def _run(self) -> None:
        while True:
            seq, command = self._commands.get()
            kind = command.get("type")
            if kind == "shutdown":
                self.backend.close()
                self._replies.put(_SHUTDOWN)
                return
            handler = {
                "load": self._load,
                "generate": self._generate,
                "unload": self._unload,
                "reset": self._reset,
                "status": self._status,
            }.get(kind, self._other)
            try:
                handler(seq, command)
            except Exception as e:  # noqa: BLE001 - every failure becomes a reply
                self._reply({"type": "error", "request_id": command.get("request_id"), "error": str(e)})

    def _load(self, _seq: int, c: dict[str, Any]) -> None:
        config = SimpleNamespace(
            identifier=c["model_name"],
            is_vision=c.get("is_vision", False),
            is_lora=c.get("is_lora", False),
            is_gguf=c.get("is_gguf", False),
            base_model=c.get("base_model"),
            audio_type=c.get("audio_type"),
            mlx_distributed=c.get("mlx_distributed", False),
            mlx_parallel_mode=c.get("mlx_parallel_mode"),
        )

        def heartbeat(p: t.LoadProgress) -> None:
            message = f"{p['stage']}: {p['message']}" if p.get("message") else str(p["stage"])
            self._reply({"type": "status", "message": message})

        loading = threading.Event()

        def keep_alive() -> None:
            started = time.monotonic()
            while not loading.wait(HEARTBEAT_S):
                self._reply({"type": "status", "message": f"loading {c['model_name']} ({time.monotonic() - started:.0f} s)"})

        threading.Thread(target=keep_alive, name="mlx-worker-heartbeat", daemon=True).start()
        try:
            self.backend.load_model(
                config,
                max_seq_length=c.get("max_seq_length", 2048),
                load_in_4bit=c.get("load_in_4bit", True),
                hf_token=c.get("hf_token") or None,
                trust_remote_code=c.get("trust_remote_code", False),
                kv_bits=c.get("mlx_kv_bits"),
                chat_template_override=c.get("chat_template_override"),
                on_progress=heartbeat,
            )
        except Exception as e:  # noqa: BLE001
            self._reply({"type": "loaded", "success": False, "error": str(e), "stack": traceback.format_exc()})
            return
        finally:
            loading.set()
        model_info = self.backend.models[c["model_name"]]["model_info"]
        self._reply({"type": "loaded", "success": True, "model_info": model_info})

    def _generate(self, seq: int, c: dict[str, Any]) -> None:
        request_id = c.get("request_id")
        if seq < self._unload_mark:
            self._reply({"type": "gen_done", "request_id": request_id, "cancelled": True, "stats": None})
            return
        self._cancel.clear()  # as Studio: cleared when a generate starts
        kwargs = {k: c[k] for k in _GENERATE_FIELDS if c.get(k) is not None}
        image = c.get("image_base64")
        try:
            for text in self.backend.generate_chat_response(image=image, cancel_event=self._cancel, **kwargs):
                self._reply({"type": "token", "request_id": request_id, "text": text})
            self.backend.wait_for_generation(timeout=30)
        except Exception as e:  # noqa: BLE001
            self._reply({"type": "gen_error", "request_id": request_id, "error": str(e), "stack": traceback.format_exc()})
            return
        self._reply({"type": "gen_done", "request_id": request_id, "stats": self.backend.last_generation_stats})

    def _unload(self, _seq: int, c: dict[str, Any]) -> None:
        name = c.get("model_name") or self.backend.active_model_name
        if name is not None:
            self.backend.unload_model(name)
        self._reply({"type": "unloaded", "model_name": name})

    def _reset(self, _seq: int, _c: dict[str, Any]) -> None:
        self.backend.reset_generation_state()
        self._reply({"type": "reset_ack"})

    def _status(self, _seq: int, _c: dict[str, Any]) -> None:
        self._reply(
            {
                "type": "status_response",
                "active_model": self.backend.active_model_name,
                "models": list(self.backend.models),
                "loading": sorted(self.backend.loading_models),
            }
        )

    def _other(self, _seq: int, c: dict[str, Any]) -> None:
        params = {k: v for k, v in c.items() if k != "type"}
        result = self.backend.client.call(str(c.get("type")), params)
        self._reply({"type": str(c.get("type")), "request_id": c.get("request_id"), "result": result})
