"""Unsloth Studio on mlx-worker: Studio 2026.10's ``MLXInferenceBackend``, served by the worker.

Studio's inference child imports its MLX backend in one line (``core/inference/worker.py``,
2026.10.9: line 2101); the drop-in changes only that line (``studio/studio-2026.10.9.patch``)::

    from mlx_worker.studio import MLXInferenceBackend, _init_mlx_distributed

Everything Studio's worker and orchestrator call or read is here with Studio's names, keywords
and value vocabularies (``docs/studio.md`` cites Studio's lines for each): ``load_model`` with
every keyword Studio passes, ``models[name]`` with the keys Studio forwards, the generate
methods yielding cumulative text, ``last_generation_stats`` latched before a generator ends,
``count_chat_tokens``, raw completions, batched rows, and the refusals Studio's own backend
gives for what the worker lacks (TurboQuant, the MTP/DFlash/DSpark/EAGLE-3 drafters, audio,
video, int8 prefill, offload).
"""

from __future__ import annotations

import base64
import io
import logging
import os
import time
from typing import Any, Iterable, Iterator

from . import _types as t
from .client import Client, Generation
from .errors import (
    ContextOverflowError,
    InvalidParamsError,
    MemoryBudgetError,
    MLXWorkerError,
    NoModelError,
    WorkerDiedError,
)

# How often a generator and the cancel watcher look at ``cancel_event`` (seconds).
_POLL_S = 0.02
# How long a stopped generator waits for the worker's answer, so its stats are latched.
_ANSWER_WAIT_S = 30.0
# How long admitting a resident row waits for the worker to refuse its params (it answers a
# refusal as the request arrives).
_ADMIT_CHECK_S = 0.05
#: How many generations the worker runs together (``--max-batch``): Studio's batched rows.
BATCH_WIDTH = 4

# -- Studio's vocabularies ------------------------------------------------------------------

#: ``kv_quant`` as Studio's settings send it: "auto" (none), integer widths, TurboQuant widths.
KV_BITS_CHOICES = (8, 6, 5, 4, 3, 2)
TURBOQUANT_BITS_CHOICES = (4, 3.5, 3, 2)
TURBOQUANT_PREFIX = "tq-"
#: The widths the worker quantizes its KV cache to.
WORKER_KV_BITS = (8, 4)
#: Studio's speculation modes, and the legacy names it maps onto them.
SPEC_MODES = ("auto", "off", "ngram", "mtp", "dflash", "dspark", "eagle3")
_SPEC_ALIASES = {
    "mtp+ngram": "mtp", "default": "auto", "draft-mtp": "mtp", "draft-dspark": "dspark",
    "draft-dflash": "dflash", "ngram-mod": "ngram", "ngram-simple": "ngram", "none": "off",
    "disable": "off", "disabled": "off",
}  # fmt: skip
#: Studio's cap on a copy or draft depth.
_SPEC_DEPTH_MAX = 16


def parse_kv_quant(value: Any) -> tuple[int | float | None, bool]:
    """Studio's ``kv_quant`` string as ``(bits, turboquant)``: ``None``/``""``/``"auto"`` and
    anything unknown are ``(None, False)`` (no quantization, as Studio's backend reads them)."""
    text = "" if value is None else str(value).strip().lower()
    if text.startswith(TURBOQUANT_PREFIX):
        try:
            bits = float(text[len(TURBOQUANT_PREFIX) :])
        except ValueError:
            return None, False
        if bits in TURBOQUANT_BITS_CHOICES:
            return (int(bits) if bits.is_integer() else bits), True
        return None, False
    if text.isdigit() and int(text) in KV_BITS_CHOICES:
        return int(text), False
    return None, False


def encode_kv_quant(bits: int | float | None, turboquant: bool = False) -> str:
    """The inverse of :func:`parse_kv_quant` (``"auto"`` for none)."""
    if bits is None:
        return "auto"
    if turboquant:
        return f"{TURBOQUANT_PREFIX}{bits:g}"
    return str(int(bits))


def spec_mode(value: Any) -> str:
    """Studio's ``speculative_type`` normalised: one of :data:`SPEC_MODES` (``"auto"`` else)."""
    if not isinstance(value, str) or not value.strip():
        return "auto"
    mode = value.strip().lower()
    mode = _SPEC_ALIASES.get(mode, mode)
    return mode if mode in SPEC_MODES else "auto"


def format_type(template: Any) -> str:
    """Studio's ``chat_template_info.format_type`` of a template text."""
    if not template:
        return "generic"
    if not isinstance(template, str):
        return "generic"
    low = template.lower()
    if "start_header_id" in low and "end_header_id" in low:
        return "llama3"
    if "[inst]" in low and "[/inst]" in low:
        return "mistral"
    if "<|im_start|>" in low and "<|im_end|>" in low:
        return "chatml"
    return "custom"


def _init_mlx_distributed() -> tuple[None, int, int]:
    """Studio's worker asks this for an MLX group when a load is distributed. The worker splits
    a model over its own group of ranks (started by ``mlx.launch``: ``MLXInferenceBackend(
    launch=...)``), not over one Studio's process made, so this is a group of one; Studio's
    worker then refuses the distributed load with its own message."""
    return None, 0, 1


# -- stats ----------------------------------------------------------------------------------


def generation_stats(result: t.GenerateResult) -> dict[str, Any]:
    """Studio's ``last_generation_stats`` from a ``generate`` result: ``usage`` (with
    ``prompt_tokens_details.cached_tokens``), llama-server ``timings`` (with the draft counts
    when drafts ran) and ``finish_reason`` (``"stop"`` or ``"length"``; a cancelled reply is a
    stop, as in Studio)."""
    usage, timings = result["usage"], result["timings"]

    def per_token(ms: float, n: int) -> float:
        return ms / n if n else 0.0

    studio_timings = {
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
    if usage.get("drafted_tokens"):
        studio_timings["draft_n"] = usage["drafted_tokens"]
        studio_timings["draft_n_accepted"] = usage.get("accepted_tokens", 0)
    return {
        "usage": {
            "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
            "prompt_tokens_details": {"cached_tokens": usage["cached_tokens"]},
        },
        "timings": studio_timings,
        "finish_reason": "length" if result["finish_reason"] == "length" else "stop",
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


def _context_refusal(error: ContextOverflowError | MemoryBudgetError) -> Exception:
    """A prompt over the context, or over what memory holds (then the context is the tokens
    that fit), as Studio's backend refuses it: Studio's own ``ContextBudgetExceeded`` when
    running inside Studio (its worker then reports the counts to the orchestrator), a
    ``ValueError`` with the same message and counts elsewhere."""
    data = error.data or {}
    context = data.get("context_length", data.get("tokens_that_fit", 0))
    request_tokens, context_tokens = int(data.get("prompt_tokens", 0)), int(context)
    try:
        from core.inference.context_refusal import ContextBudgetExceeded
    except ImportError:
        refusal = ValueError(
            f"Message too long: {request_tokens} tokens exceeds the {context_tokens}-token "
            "context window. Try increasing the Context Length in Model settings, or shorten "
            "the conversation."
        )
        refusal.request_tokens, refusal.context_tokens = request_tokens, context_tokens  # type: ignore[attr-defined]
        return refusal
    return ContextBudgetExceeded(request_tokens, context_tokens)


class _Reasoning:
    """Studio's reasoning normalisation over the worker's deltas. The worker marks each delta's
    ``channel``; where a thought arrives without its ``<think>`` tag (one the template opened
    in the prompt, harmony's analysis channel), the tag is written before it, and ``</think>``
    where the answer starts, so the cumulative text reads ``<think>...</think>answer`` as
    Studio's backend yields it (a thought cut off stays open, as there)."""

    def __init__(self, reasoning: bool = True) -> None:
        self.text = ""
        self._reasoning = reasoning  # False: a raw completion's text, as it comes
        self._open = False  # a <think> this class wrote is open

    def add(self, delta: t.GenerateDelta) -> str:
        text, channel = delta["text"], delta.get("channel") if self._reasoning else None
        if channel == "reasoning" and not self.text and not text.lstrip().startswith("<think>"):
            self.text, self._open = "<think>", True
        elif channel == "content" and self._open:
            self.text, self._open = self.text + "</think>", False
        self.text += text
        if self._open and "</think>" in text:  # the model closed the thought itself
            self._open = False
        return self.text


class MLXInferenceBackend:
    """Studio's ``MLXInferenceBackend`` (2026.10) on one mlx-worker process, started by the first
    ``load_model`` and replaced after a crash by the next one.

    ``binary`` is the worker (else ``$MLX_WORKER_BIN``, else the one installed with this
    package, else ``mlx-worker`` on PATH). ``launch``, when given, starts the worker as a group
    of ranks (e.g. ``["mlx.launch", "--backend", "ring", "--hosts", "10.0.0.1,10.0.0.2",
    "--"]``); a ``config`` with ``mlx_distributed`` and ``mlx_parallel_mode`` then splits the
    model over them.
    """

    def __init__(
        self,
        binary: str | os.PathLike[str] | None = None,
        *,
        worker_args: Iterable[str] = ("--max-batch", str(BATCH_WIDTH)),
        launch: Iterable[str] = (),
    ):
        self.models: dict[str, dict[str, Any]] = {}
        self.active_model_name: str | None = None
        self.loading_models: set[str] = set()
        self.loaded_local_models: list[str] = []
        self.device = "mlx"
        #: Studio's ``stats`` of the last generation, set before its generator ends.
        self.last_generation_stats: dict[str, Any] | None = None
        #: Per row of the last :meth:`generate_chat_batch`.
        self.last_batch_generation_stats: list[dict[str, Any] | None] = []
        #: The last generation's whole ``generate`` result (``tool_calls`` included).
        self.last_generation_result: t.GenerateResult | None = None
        self._distributed_group = None
        self._distributed_rank = 0
        self._distributed_world_size = 1
        self._binary = binary
        self._worker_args = list(worker_args)
        self._launch = list(launch)
        self._client: Client | None = None

    # -- the worker -------------------------------------------------------------------------

    @property
    def client(self) -> Client:
        """The worker's client (started on first use)."""
        if self._client is None:
            if self._launch:
                from ._core import find_binary

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

    def _active(self) -> dict[str, Any]:
        if self.active_model_name is None or self._client is None or not self._client.alive:
            raise RuntimeError("No model loaded")
        return self.models[self.active_model_name]

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
        parallel_mode: str | None = None,
        distributed_group: Any = None,
        kv_quant: Any = None,
        chat_template_override: str | None = None,
        int8_prefill: bool = False,
        speculative_type: str | None = None,
        spec_draft_n_max: int | None = None,
        spec_draft_model: str | None = None,
        spec_drafters_allowed: Any = None,
        offload: tuple[Any, Any] = (None, None),
        *,
        on_progress: Any = None,
    ) -> bool:
        """Loads ``config.identifier`` (or ``config`` itself as a name) and makes it active;
        returns True or raises, leaving the models already loaded as they were.

        The keywords are Studio's (``worker.py`` passes them all). ``hf_token`` goes to the
        worker's hub client only, never into ``os.environ``; ``gpu_ids`` is accepted and ignored
        (MLX has one device). Without a ``spec_draft_model``, a companion drafter named for the
        model in the local Hugging Face cache is found by Studio's own discovery, within
        ``spec_drafters_allowed`` (:func:`_cached_companion`). What the worker cannot do is
        reported in Studio's fields, as Studio's backend reports it, not raised.
        """
        del gpu_ids
        name = config.identifier if hasattr(config, "identifier") else str(config)
        if distributed_group is not None and _group_size(distributed_group) > 1:
            raise ValueError(
                "mlx-worker splits a model over its own group of ranks "
                "(MLXInferenceBackend(launch=[...])), not over an MLX group made in Studio's "
                "process: run without distributed inference."
            )
        audio_type = getattr(config, "audio_type", None)
        if audio_type and audio_type != "audio_vlm":
            raise RuntimeError(
                f"cannot load {name!r}: mlx-worker serves text and vision models; audio models "
                "(speech in or out) are not supported"
            )
        kv_bits, turboquant = parse_kv_quant(kv_quant)
        kv_sent = kv_bits if (not turboquant and kv_bits in WORKER_KV_BITS) else None
        mode = spec_mode(speculative_type)
        draft_model = spec_draft_model if (spec_draft_model and mode in ("auto", *_COMPANION_MODES)) else None
        # Studio looks for none where it cannot speculate (`speculation_refusal`: a quantized KV
        # cache, an adapter). The worker quantizes only 8 and 4 bits: other widths load without,
        # and a drafter then drafts (as a named one does).
        refused = kv_sent is not None or getattr(config, "is_lora", False)
        if not spec_draft_model and not refused:
            vision = bool(getattr(config, "is_vision", False))
            draft_model = _cached_companion(mode, name, vision, spec_drafters_allowed)
        params: dict[str, Any] = {
            "max_seq_length": int(max_seq_length) if max_seq_length and int(max_seq_length) > 0 else 0,
            "load_in_4bit": bool(load_in_4bit),
            "hf_token": hf_token or None,
            "trust_remote_code": bool(trust_remote_code),
            "dtype": _dtype_name(dtype),
            "is_vision": getattr(config, "is_vision", None),
            "is_lora": getattr(config, "is_lora", None),
            "is_gguf": getattr(config, "is_gguf", None),
            "kv_bits": kv_sent,
            "chat_template_override": chat_template_override or None,
            "draft_model": draft_model,
        }
        if getattr(config, "mlx_distributed", False) and (parallel_mode or getattr(config, "mlx_parallel_mode", None)):
            params["parallel"] = parallel_mode or config.mlx_parallel_mode
        model = name
        base_model = getattr(config, "base_model", None)
        if getattr(config, "is_lora", False) and base_model:
            model, params["adapter"] = base_model, name
        if self._client is not None and not self._client.alive:
            self._forget_models()  # it died since: the next load starts a fresh one
        draft_refused = False
        try:
            try:
                loaded = self.client.load(model, on_progress=on_progress, **params)
            except InvalidParamsError as e:
                if draft_model is None or e.field != "draft_model":
                    raise
                # As Studio: a drafter that does not fit the model is passed over.
                params["draft_model"], draft_model, draft_refused = None, None, True
                loaded = self.client.load(model, on_progress=on_progress, **params)
        except WorkerDiedError:
            self._forget_models()
            raise
        info = loaded["info"]
        kv = info["kv_quantization"]
        speculation = _speculation(
            mode, spec_draft_model, draft_model, draft_refused, kv.get("applied"), spec_draft_n_max,
            info.get("mtp_layers", 0), info.get("draft_kind"), bool(info["is_vision"]),
        )
        template = info["chat_template"]
        entry: dict[str, Any] = {
            "model_id": loaded["model_id"],
            "load_result": loaded,
            "trust_remote_code": bool(trust_remote_code),
            "gguf_variant": None,
            "precision_folder": None,
            "is_vision": info["is_vision"],
            "is_lora": info["is_lora"],
            "base_model": base_model if info["is_lora"] else None,
            "is_audio": False,
            "audio_type": None,
            "has_audio_input": False,
            "has_video_input": False,
            "context_length": info["context_length"],
            "requested_context_length": params["max_seq_length"],
            "native_context_length": info.get("native_context_length", info["context_length"]),
            "max_context_length": info.get("native_context_length", info["context_length"]),
            # The worker refuses a prompt longer than the context (never slides past it).
            "context_length_enforced": True,
            "context_length_fitted": (
                info["context_length"] if (info.get("memory") or {}).get("fitted_from") else None
            ),
            "context_unbounded_when_batched": False,
            "mlx_context_budget": info["context_length"],
            **_kv_fields(kv_bits, turboquant, kv),
            "mlx_int8_prefill": False,
            "mlx_int8_prefill_requested": bool(int8_prefill),
            "mlx_int8_prefill_reason": "mlx-worker has no int8 prefill" if int8_prefill else "",
            "mlx_offload": _offload_fields(offload),
            "chat_template_override_requested": chat_template_override,
            "chat_template_override_reason": None,
            **speculation,
            "chat_template_info": {
                "has_template": template["present"],
                "template": template.get("text"),
                "format_type": format_type(template.get("text")),
                "template_name": None,
                "special_tokens": {
                    f"{k}_token": v for k, v in info["special_tokens"].items() if v
                } if template["present"] else {},
                "renders_image": info["is_vision"],
                "accepts_multiple_images": False,
            },
        }
        self.models[name] = entry
        if os.path.isdir(name) and name not in self.loaded_local_models:
            self.loaded_local_models.append(name)
        self.active_model_name = name
        return True

    def unload_model(self, model_name: str) -> bool:
        """Unloads ``model_name`` (the worker frees its memory); always True, as Studio's."""
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

    def reset_generation_state(self, caller_cancel_event: Any = None) -> None:
        """Frees MLX's buffer cache; the conversations' prompt caches stay (Studio resets after
        every stopped reply, and the next turn reuses its prefix)."""
        del caller_cancel_event
        if self._client is not None and self._client.alive:
            self._client.reset(prompt_cache=False)

    # -- counting and raw prompts -----------------------------------------------------------

    def count_chat_tokens(
        self,
        messages: list[dict[str, Any]],
        system_prompt: str = "",
        *,
        tools: list[dict[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        reasoning_effort: str | None = None,
        preserve_thinking: bool | None = None,
    ) -> int:
        """The prompt's tokens as ``generate`` would run it (template, system prompt, tools)."""
        entry = self._active()
        result = self.client.tokenize(
            model=entry["model_id"],
            messages=_text_only(messages),
            system_prompt=system_prompt or None,
            tools=tools,
            enable_thinking=enable_thinking,
            reasoning_effort=reasoning_effort,
            preserve_thinking=preserve_thinking,
        )
        return int(result["count"])

    def resolve_completion_prompt(self, prompt: Any) -> dict[str, Any]:
        """A raw completion's prompt as token ids, as llama-server tokenizes one: a string, or
        a list of strings and token ids (special tokens parsed; the tokenizer's BOS once, for a
        leading string). ``{"ids", "text", "n_vocab"}``; ``ValueError`` for a bad prompt."""
        entry = self._active()
        if isinstance(prompt, dict):
            prompt = prompt.get("prompt_string")
        pieces = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(pieces, list) or not all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in pieces):
            raise ValueError("Invalid prompt.")
        n_vocab = int(entry["load_result"]["info"]["vocab_size"])
        ids: list[int] = []
        for i, piece in enumerate(pieces):
            if isinstance(piece, int):
                ids.append(piece)
            elif piece:
                tokens = self.client.tokenize(model=entry["model_id"], text=piece)["tokens"]
                if i > 0 and tokens and tokens[0] in _bos_ids(self.client, entry):
                    tokens = tokens[1:]
                ids.extend(tokens)
        if not ids:
            raise ValueError("The prompt is empty.")
        if any(not 0 <= i < n_vocab for i in ids):
            raise ValueError("Prompt contains invalid tokens.")
        text = "".join(p for p in pieces if isinstance(p, str))
        return {"ids": ids, "text": text, "n_vocab": n_vocab}

    def generate_completion(
        self,
        prompt_ids: list[int],
        temperature: float = 0.7,
        top_p: float = 0.9,
        top_k: int = 40,
        min_p: float = 0.0,
        max_new_tokens: int = 256,
        repetition_penalty: float = 1.0,
        cancel_event: Any = None,
        presence_penalty: float = 0.0,
        seed: int | None = None,
        frequency_penalty: float = 0.0,
        logit_bias: dict[Any, float] | None = None,
        stop: Any = None,
        penalty_window: int | None = None,
        grammar: str | None = None,
        n_probs: int = 0,
    ) -> Iterator[str]:
        """A raw completion of ``prompt_ids`` (no chat template): yields the text so far."""
        params = self._completion_params(
            prompt_ids, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
            max_new_tokens=max_new_tokens, repetition_penalty=repetition_penalty,
            presence_penalty=presence_penalty, seed=seed, frequency_penalty=frequency_penalty,
            logit_bias=logit_bias, stop=stop, penalty_window=penalty_window, grammar=grammar,
            n_probs=n_probs,
        )  # fmt: skip
        self.last_generation_stats = None
        yield from self._stream([], params, cancel_event, reasoning=False)

    # -- chat -------------------------------------------------------------------------------

    def generate_chat_response(
        self,
        messages: list[dict[str, Any]],
        system_prompt: str = "",
        image: Any = None,
        images: list[Any] | None = None,
        image_ordinal: int | None = None,
        temperature: float = 0.7,
        top_p: float = 0.9,
        top_k: int = 40,
        min_p: float = 0.0,
        max_new_tokens: int = 256,
        repetition_penalty: float = 1.0,
        cancel_event: Any = None,
        tools: list[dict[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        reasoning_effort: str | None = None,
        preserve_thinking: bool | None = None,
        continue_final_message: bool = False,
        presence_penalty: float = 0.0,
        seed: int | None = None,
        frequency_penalty: float = 0.0,
        logit_bias: dict[Any, float] | None = None,
        stop: Any = None,
        response_format: dict[str, Any] | None = None,
        reasoning_is_extracted: bool = False,
        _adapter_state: bool | None = None,
        tool_protocol_active: bool | None = None,
        video: Any = None,
    ) -> Iterator[str]:
        """Yields the reply so far (cumulative text, only ever growing, a template-opened or
        native-channel thought as ``<think>...</think>``).

        ``cancel_event`` is anything with ``is_set()`` (Studio's worker passes its own
        ``_StopWhileItRuns``), looked at every 20 ms, prefill included: once set, the worker is
        told and this generator ends when it has answered (at its next prefill chunk or decode
        step); ``last_generation_stats`` is set before it ends, also then.
        Every keyword is Studio's; ``image_ordinal``, ``reasoning_is_extracted`` and
        ``tool_protocol_active`` change nothing here (one image per turn; the worker's text is
        raw). A vision model gets ``image`` (else the newest of ``images``, as Studio's backend
        keeps one image for a template without several image markers).
        """
        del image_ordinal, reasoning_is_extracted, tool_protocol_active
        params = self._chat_params(
            system_prompt=system_prompt, image=image, images=images, temperature=temperature,
            top_p=top_p, top_k=top_k, min_p=min_p, max_new_tokens=max_new_tokens,
            repetition_penalty=repetition_penalty, tools=tools, enable_thinking=enable_thinking,
            reasoning_effort=reasoning_effort, preserve_thinking=preserve_thinking,
            continue_final_message=continue_final_message, presence_penalty=presence_penalty,
            seed=seed, frequency_penalty=frequency_penalty, logit_bias=logit_bias, stop=stop,
            response_format=response_format, _adapter_state=_adapter_state, video=video,
        )  # fmt: skip
        self.last_generation_stats = None
        yield from self._stream(list(messages), params, cancel_event, reasoning=True)

    def _chat_params(
        self,
        *,
        system_prompt: str = "",
        image: Any = None,
        images: list[Any] | None = None,
        temperature: float = 0.7,
        top_p: float = 0.9,
        top_k: int = 40,
        min_p: float = 0.0,
        max_new_tokens: int = 256,
        repetition_penalty: float = 1.0,
        tools: list[dict[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        reasoning_effort: str | None = None,
        preserve_thinking: bool | None = None,
        continue_final_message: bool = False,
        presence_penalty: float = 0.0,
        seed: int | None = None,
        frequency_penalty: float = 0.0,
        logit_bias: dict[Any, float] | None = None,
        stop: Any = None,
        response_format: dict[str, Any] | None = None,
        _adapter_state: bool | None = None,
        video: Any = None,
        **ignored: Any,
    ) -> dict[str, Any]:
        """The worker's ``generate`` params for Studio's chat keywords (one home for the mapping:
        single replies, batched rows and resident rows)."""
        del ignored  # Studio's keywords that change nothing here (see generate_chat_response)
        entry = self._active()
        if video is not None:
            raise RuntimeError("The loaded model does not read video.")
        if max_new_tokens is None:  # as Studio: unset fills the context (the worker caps it there)
            max_new_tokens = entry["context_length"]
        params = _sampling(temperature, top_p, top_k, min_p, max_new_tokens, repetition_penalty, presence_penalty)
        params.update(
            model=entry["model_id"],
            system_prompt=system_prompt or "",
            tools=tools or None,
            enable_thinking=enable_thinking,
            reasoning_effort=reasoning_effort,
            preserve_thinking=preserve_thinking,
            continue_final_message=bool(continue_final_message),
            use_adapter=_adapter_state,
            speculative=entry.get("speculative"),
            **_options(seed, frequency_penalty, logit_bias, stop, response_format),
        )
        picture = image if image is not None else (images[-1] if images else None)
        if entry["is_vision"] and picture is not None:
            params["image"] = image_to_wire(picture)
        return {k: v for k, v in params.items() if v is not None}

    def _completion_params(self, prompt_ids: list[int], **sampling: Any) -> dict[str, Any]:
        """The worker's ``generate`` params for a raw completion (``generate_completion``'s
        keywords)."""
        entry = self._active()
        params = _sampling(
            sampling.get("temperature", 0.7), sampling.get("top_p", 0.9), sampling.get("top_k", 40),
            sampling.get("min_p", 0.0), sampling.get("max_new_tokens", 256),
            sampling.get("repetition_penalty", 1.0), sampling.get("presence_penalty", 0.0),
        )  # fmt: skip
        params.update(
            model=entry["model_id"],
            prompt_ids=list(prompt_ids),
            **_options(sampling.get("seed"), sampling.get("frequency_penalty"), sampling.get("logit_bias"), sampling.get("stop"), None),
        )
        window = sampling.get("penalty_window")
        if window is not None and int(window) == 0:  # llama.cpp's repeat_last_n 0: penalties off
            params.update(repetition_penalty=1.0, presence_penalty=0.0)
            params.pop("frequency_penalty", None)
        elif window is not None:
            params["repetition_context_size"] = int(window)
        if sampling.get("grammar"):
            params["grammar"] = sampling["grammar"]
        if sampling.get("n_probs"):
            params["logprobs"] = min(int(sampling["n_probs"]), 20)
        return params

    def generate_with_adapter_control(
        self, use_adapter: bool | None = None, cancel_event: Any = None, **gen_kwargs: Any
    ) -> Iterator[str]:
        """:meth:`generate_chat_response` with the adapter on (True), off (False: the base
        weights, no reload) or as loaded (None)."""
        if use_adapter is not None and not isinstance(use_adapter, bool):
            if isinstance(use_adapter, str):
                raise NotImplementedError(
                    "named adapter selection is not supported; use True for the loaded adapter "
                    "or False for the base model."
                )
            raise TypeError("use_adapter must be None, True, False, or a string.")
        yield from self.generate_chat_response(cancel_event=cancel_event, _adapter_state=use_adapter, **gen_kwargs)

    def generate_audio_input_response(self, *args: Any, **kwargs: Any) -> Iterator[str]:
        """Audio input: refused as Studio's backend refuses a model without an audio tower."""
        del args, kwargs
        raise RuntimeError(
            "Audio input is not supported for this model on the MLX backend: no verified "
            "audio-capable tower/processor was detected at load."
        )
        yield ""  # a generator, as Studio's: the refusal comes at the first next()

    def _stream(
        self, messages: list[dict[str, Any]], params: dict[str, Any], cancel_event: Any, *, reasoning: bool
    ) -> Iterator[str]:
        client = self.client
        try:
            generation = client.generate(messages, **params)
        except WorkerDiedError:
            self._forget_models()
            raise
        text = _Reasoning(reasoning)
        try:
            while True:
                # Looked at every 20 ms, prefill included, on the consumer's own thread: Studio's
                # stop object reads its StopLedger and may answer held commands, so only the
                # thread that runs the generator may call it.
                if cancel_event is not None and cancel_event.is_set():
                    break
                delta = generation.poll(_POLL_S)
                if delta is not None:
                    if delta["text"] or (reasoning and delta.get("channel")):
                        yield text.add(delta)
                elif generation.done:
                    break
        except WorkerDiedError:
            self._forget_models()
            raise
        except (ContextOverflowError, MemoryBudgetError) as e:
            raise _context_refusal(e) from None
        finally:
            self._latch(generation)

    def _latch(self, generation: Generation) -> None:
        """Waits for the worker's answer (a cancelled generation answers at its next step) and
        records it, so Studio reads the stats right after the generator ends."""
        try:
            if not generation.done:
                generation.cancel()
            deadline = time.monotonic() + _ANSWER_WAIT_S
            while not generation.done and time.monotonic() < deadline:
                generation.poll(_POLL_S)
            if generation.done:
                result = generation.finish()
                self.last_generation_result = result
                self.last_generation_stats = generation_stats(result)
        except WorkerDiedError:
            self._forget_models()
        except MLXWorkerError:
            pass  # the generation's own error is raised where it was read

    # -- batches ----------------------------------------------------------------------------

    def _row(self, request: dict[str, Any], adapter_state: Any) -> tuple[Generation, _Reasoning]:
        """One batched or resident row as a ``generate`` of its own: the worker joins the
        generations in flight into one batch between its decode steps (``--max-batch``)."""
        if "prompt_ids" in request:
            fields = {k: v for k, v in request.items() if k != "prompt_ids"}
            params, messages = self._completion_params(request["prompt_ids"], **fields), []
        else:
            params = self._chat_params(**{**request, "_adapter_state": adapter_state})
            messages = list(request.get("messages") or [])
        return self.client.generate(messages, **params), _Reasoning("prompt_ids" not in request)

    def batch_unavailable_reason(self, requests: list[dict[str, Any]]) -> str | None:
        """Why ``requests`` cannot run as one batch (None: they can), in Studio's words."""
        if self.active_model_name is None:
            return "no model is loaded"
        for request in requests:
            reason = _row_gap(request)
            if reason is not None:
                return reason
        if len(requests) < 2:
            return "fewer than two replies were requested"
        return None

    def resident_unavailable_reason(self, request: dict[str, Any]) -> str | None:
        """Why ``request`` cannot join the open batch (None: it can)."""
        if self.active_model_name is None:
            return "no model is loaded"
        return _row_gap(request)

    def open_resident_batch(self, *, width: int, adapter_state: Any = None) -> "_ResidentSession":
        """Studio's resident batch: replies join and leave while the others decode. Each row is
        a generate of its own; the worker decodes them together."""
        self._active()
        return _ResidentSession(self, width, adapter_state)

    def generate_chat_batch(
        self, requests: list[dict[str, Any]], *, cancel_event: Any = None, _adapter_state: bool | None = None
    ) -> Iterator[tuple[int, str | None]]:
        """Several replies at once on the worker's continuous batching: yields ``(row, text so
        far)`` and ``(row, None)`` when a row ends (its stats are in
        ``last_batch_generation_stats[row]`` by then)."""
        reason = self.batch_unavailable_reason(requests)
        if reason is not None:
            raise RuntimeError(f"MLX batched generation is unavailable: {reason}")
        self.last_batch_generation_stats = [None] * len(requests)
        self.last_generation_stats = None
        session = _ResidentSession(self, len(requests), _adapter_state)
        try:
            for row, request in enumerate(requests):
                session.admit(request, row)
            while session.rows_in_flight:
                if cancel_event is not None and cancel_event.is_set():
                    events = session.withdraw(session.handles)
                else:
                    events = session.step(None)
                for row, text in events:
                    if text is None:
                        self.last_batch_generation_stats[row] = session.take_stats(row)
                    yield row, text
        finally:
            session.close()


class _ResidentSession:
    """Studio's resident-batch session (``admit``, ``step``, ``withdraw``, ``take_stats``,
    ``close``, ``rows_in_flight``, ``handles``, ``ending``) over concurrent ``generate``
    requests. Rows are retired as they end, so none is ever left ``ending``."""

    def __init__(self, backend: MLXInferenceBackend, width: int, adapter_state: Any):
        self._backend = backend
        self.width = width
        self._adapter_state = adapter_state
        self._rows: dict[Any, tuple[Generation, _Reasoning]] = {}
        self._early: dict[Any, list[t.GenerateDelta]] = {}  # deltas read while admitting
        self._stats: dict[Any, dict[str, Any]] = {}

    @property
    def rows_in_flight(self) -> int:
        return len(self._rows)

    @property
    def handles(self) -> list[Any]:
        return list(self._rows)

    @property
    def ending(self) -> list[Any]:
        return []

    def admit(self, request: dict[str, Any], handle: Any) -> str:
        """Starts a row; returns the text to show before its first token (none here). A prompt
        over the context is refused here (Studio's ``RowRefused``: it then runs alone and gets
        Studio's context refusal), not mid-batch, where an error would end every row."""
        backend = self._backend
        entry = backend._active()
        if "prompt_ids" in request:
            if len(request["prompt_ids"]) >= entry["context_length"]:
                raise _row_refused("the prompt does not fit the context; it runs alone")
        else:
            counted = backend.count_chat_tokens(
                request.get("messages") or [], request.get("system_prompt") or "",
                tools=request.get("tools"), enable_thinking=request.get("enable_thinking"),
                reasoning_effort=request.get("reasoning_effort"),
                preserve_thinking=request.get("preserve_thinking"),
            )  # fmt: skip
            if counted >= entry["context_length"]:
                raise _row_refused("the prompt does not fit the context; it runs alone")
        generation, text = backend._row(request, self._adapter_state)
        # The worker checks a request's params as it arrives: a refusal comes back at once,
        # and the row then runs alone, where the error is its own (in the batch it would end
        # every row).
        deadline, early = time.monotonic() + _ADMIT_CHECK_S, []
        try:
            while time.monotonic() < deadline and not generation.done:
                delta = generation.poll(0.005)
                if delta is not None:
                    early.append(delta)
            if generation.done and generation.result is None:
                generation.finish()  # raises the worker's refusal
        except WorkerDiedError:
            backend._forget_models()
            raise
        except MLXWorkerError as refusal:
            raise _row_refused(f"the worker refused this reply alone: {refusal}") from None
        self._rows[handle] = (generation, text)
        self._early[handle] = early
        return ""

    def step(self, waiting: Any = None) -> Iterator[tuple[Any, str | None]]:
        """What the rows produced since the last step: ``(handle, text so far)``, and
        ``(handle, None)`` for a row that ended. Waits up to 20 ms for something, less when
        ``waiting()`` says commands are pending."""
        deadline = time.monotonic() + _POLL_S
        while True:
            events = list(self._drain())
            if events or time.monotonic() >= deadline or (waiting is not None and waiting()):
                yield from events
                return
            time.sleep(0.002)

    def _drain(self) -> Iterator[tuple[Any, str | None]]:
        for handle, (generation, text) in list(self._rows.items()):
            early = self._early.pop(handle, [])
            while early or (delta := generation.poll(0)) is not None:
                if early:
                    delta = early.pop(0)
                if delta["text"] or delta.get("channel"):
                    yield handle, text.add(delta)
            if generation.done:
                yield from self._retire(handle)

    def withdraw(self, handles: Iterable[Any]) -> Iterator[tuple[Any, str | None]]:
        """Stops these rows; each ends with ``(handle, None)`` and its stats."""
        for handle in list(handles):
            if handle in self._rows:
                try:
                    self._rows[handle][0].cancel()
                except MLXWorkerError:
                    pass
                yield from self._retire(handle)

    def _retire(self, handle: Any) -> Iterator[tuple[Any, str | None]]:
        generation, _ = self._rows.pop(handle)
        try:
            self._stats[handle] = generation_stats(generation.finish())
        except WorkerDiedError:
            self._backend._forget_models()
            raise
        yield handle, None

    def take_stats(self, handle: Any) -> dict[str, Any] | None:
        return self._stats.pop(handle, None)

    def close(self) -> None:
        """Stops every row still running (each is answered; one that failed is dropped)."""
        for handle in self.handles:
            try:
                for _ in self.withdraw([handle]):
                    pass
            except WorkerDiedError:
                raise
            except MLXWorkerError:
                self._rows.pop(handle, None)


# -- helpers ----------------------------------------------------------------------------------


def _row_refused(reason: str) -> Exception:
    """Studio's ``RowRefused`` (its worker then runs the reply alone) inside Studio; a
    ``RuntimeError`` elsewhere."""
    try:
        from core.inference.worker import RowRefused
    except ImportError:
        return RuntimeError(reason)
    return RowRefused(reason)


def _group_size(group: Any) -> int:
    try:
        return int(group.size())
    except Exception:  # noqa: BLE001 - not an MLX group: treat as one process
        return 1


def _sampling(temperature, top_p, top_k, min_p, max_new_tokens, repetition_penalty, presence_penalty) -> dict[str, Any]:
    """The sampler's params; a repetition penalty of 0 or 1 means off, as in Studio."""
    if repetition_penalty is None or float(repetition_penalty) in (0.0, 1.0):
        repetition_penalty = 1.0
    return {
        "temperature": float(temperature if temperature is not None else 0.7),
        "top_p": float(top_p if top_p is not None else 1.0),
        "top_k": int(top_k or 0),
        "min_p": float(min_p or 0.0),
        "max_new_tokens": int(max_new_tokens if max_new_tokens is not None else 2048),
        "repetition_penalty": float(repetition_penalty),
        "presence_penalty": float(presence_penalty or 0.0),
    }


def _options(seed, frequency_penalty, logit_bias, stop, response_format) -> dict[str, Any]:
    """Studio's optional generate fields as the worker's params (absent when unset)."""
    options: dict[str, Any] = {}
    if seed is not None:
        options["seed"] = int(seed) % 2**64
    if frequency_penalty:
        options["frequency_penalty"] = float(frequency_penalty)
    if logit_bias:
        options["logit_bias"] = {str(k): float(v) for k, v in logit_bias.items()}
    if stop:
        options["stop"] = [s for s in ([stop] if isinstance(stop, str) else list(stop)) if s]
    if response_format and response_format.get("type") != "text":
        options["response_format"] = response_format
    return options


def _text_only(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages without image parts (Studio counts no media)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
        out.append({**m, "content": content})
    return out


def _bos_ids(client: Client, entry: dict[str, Any]) -> set[int]:
    bos = entry["load_result"]["info"].get("special_tokens", {}).get("bos")
    if not bos:
        return set()
    return set(client.tokenize(model=entry["model_id"], text=bos)["tokens"][:1])


def _row_gap(request: dict[str, Any]) -> str | None:
    """What keeps one request out of a batch, in Studio's words. (The worker batches any
    generate; what it cannot share a step with waits for the batch and runs alone.)"""
    if request.get("video") or request.get("video_base64"):
        return "a reply carries a video clip"
    return None


def _kv_fields(bits: int | float | None, turboquant: bool, kv: dict[str, Any]) -> dict[str, Any]:
    """Studio's ``mlx_kv_*`` fields from what was asked (``bits``, ``turboquant``) and the
    worker's ``kv_quantization`` answer."""
    applied = kv.get("applied")
    if bits is None:
        eligibility, reason = None, ""
    elif turboquant:
        eligibility = "refused"
        reason = "TurboQuant is not available in mlx-worker. The model is served without it."
    elif bits not in WORKER_KV_BITS:
        eligibility = "refused"
        reason = f"mlx-worker quantizes the KV cache to 8 or 4 bits, not {bits}. The model is served without it."
    elif applied is None:
        eligibility, reason = "none", kv.get("reason") or "this model's KV cache layout cannot be quantized"
    elif kv.get("reason"):
        eligibility, reason = "partial", kv["reason"]
    else:
        eligibility, reason = "full", ""
    return {
        "mlx_kv_bits": applied,
        "mlx_kv_bits_requested": bits,
        "mlx_kv_quant": encode_kv_quant(applied),
        "mlx_kv_quant_requested": encode_kv_quant(bits, turboquant),
        "mlx_kv_quant_eligibility": eligibility,
        "mlx_kv_quant_reason": reason,
        "mlx_kv_quant_note": "",
    }


def _offload_fields(offload: Any) -> dict[str, Any]:
    """Studio's ``mlx_offload``: nothing is read from disk; a concrete fraction asked for is
    reported as not applied, with why."""
    knobs = tuple(offload or (None, None)) + (None, None)

    def part(knob: Any) -> dict[str, Any]:
        wanted = knob not in (None, "auto", "off")
        reason = "mlx-worker keeps every weight in memory" if wanted else None
        return {"applied": None, "requested": knob, "reason": reason}

    return {"disk_bytes": None, "ple": part(knobs[0]), "experts": part(knobs[1])}


# The worker's companion drafter kinds as Studio names them (its ``_reported``: DFlash2 is
# "dflash"), and the modes that load one.
_COMPANION_KINDS = {"dflash": "dflash", "dflash2": "dflash", "dspark": "dspark", "eagle3": "eagle3"}
_COMPANION_MODES = ("dflash", "dspark", "eagle3")


def _cached_companion(mode: str, name: str, vision: bool, allowed: Any) -> str | None:
    """The snapshot of a companion drafter for model ``name`` in the local Hugging Face cache,
    found as Studio 2026.10 finds one (its ``mlx_speculative.discover_companions``: a repo
    named for the target, e.g. ``z-lab/Qwen3-8B-DFlash`` for ``Qwen/Qwen3-8B``, whose config
    fits the target's shape, within ``allowed`` repos when given), of a kind the worker loads:
    under ``dflash`` / ``dspark`` / ``eagle3`` that kind, under ``auto`` the first (Studio's
    order) and only where Studio's ``speculates_on_route`` looks (a vision model). ``None``
    outside Studio's process or where none is cached."""
    if not (mode in _COMPANION_MODES or (mode == "auto" and vision)):
        return None
    try:
        from core.inference import mlx_speculative as spec
        from utils.utils import hf_cache_snapshot_dir
    except ImportError:
        return None
    try:
        target = name if os.path.isdir(name) else hf_cache_snapshot_dir(name)
        target_config = spec._read_config(target) if target is not None else {}
        found = spec.discover_companions(name, target_config, allowed)
    except Exception as e:  # a cache that cannot be read finds nothing, as in Studio
        logging.getLogger(__name__).warning("mlx-worker: no companion drafter discovery: %s", e)
        return None
    for source in found:
        if source.kind in _COMPANION_MODES and (mode == "auto" or source.kind == mode):
            return str(source.path)
    return None


def _speculation(
    mode: str,
    named: str | None,
    draft_model: str | None,
    draft_refused: bool,
    kv_applied: Any,
    n_max: Any,
    mtp_layers: int,
    draft_kind: str | None = None,
    vision: bool = False,
) -> dict[str, Any]:
    """Studio's ``speculative_type`` / ``spec_*`` fields and the worker's ``speculative``
    request for them: ``ngram`` is the worker's prompt lookup; ``mtp`` the checkpoint's own
    multi-token-prediction head where the worker loaded one; ``dflash`` / ``dspark`` /
    ``eagle3`` the named companion the worker loaded as its draft model (``draft_kind``: DFlash2
    reported as ``dflash``, as Studio reports it); ``auto`` a named drafter,
    else that head, on a vision model or with a named drafter only (Studio's order and its
    ``speculates_on_route``: ``auto`` on a text model names nothing); a drafter not found (or of
    another kind than the mode) falls back to the copy-only n-gram draft with Studio's reason, as Studio's
    backend falls back when it finds none."""
    try:  # reported as asked (Studio's load route compares it), capped where it is used
        asked = int(n_max) if n_max is not None and int(n_max) > 0 else None
    except (TypeError, ValueError):
        asked = None
    depth = min(asked, _SPEC_DEPTH_MAX) if asked else None
    kind, reason, method = None, None, None
    if mode == "off":
        pass
    elif kv_applied is not None and (mode != "auto" or named):
        reason = "kv_quant"
    elif mode == "ngram":
        kind, method = "ngram", "prompt_lookup"
    elif mode == "auto" and not (named or vision):
        pass
    elif mode == "auto":
        # Studio's order: a named drafter, then the built-in head, then a discovered companion.
        if draft_model and named:
            kind, method = _COMPANION_KINDS.get(draft_kind, "draft_model"), "draft_model"
        elif mtp_layers:
            kind, method = "mtp", "mtp"
            reason = "drafter_incompatible" if draft_refused and named else None
        elif draft_model:
            kind, method = _COMPANION_KINDS.get(draft_kind, "draft_model"), "draft_model"
        elif draft_refused and named:  # a discovered one passed over says nothing, as in Studio
            reason = "drafter_incompatible"
    elif mode == "mtp" and mtp_layers:
        # A named companion is not loaded here: Studio passes over it to the built-in head.
        kind, method = "mtp", "mtp"
        reason = "drafter_incompatible" if named else None
    elif mode in _COMPANION_MODES and _COMPANION_KINDS.get(draft_kind) == mode:
        kind, method = mode, "draft_model"
    else:  # a dflash, dspark, eagle3 or mtp drafter not found: no such drafter here
        kind, method = "ngram", "prompt_lookup"
        reason = "drafter_incompatible" if named else "drafter_not_found"
    speculative = None
    if method is not None:
        speculative = {"method": method, **({"num_draft_tokens": depth} if depth else {})}
    return {
        "speculative_type": mode,
        "spec_draft_n_max": asked,
        "spec_draft_model": named or None,
        "spec_drafter_kind": kind,
        "spec_fallback_reason": reason,
        "speculative": speculative,
    }
