"""mlx_worker.studio: the seed's call sequence on MLXInferenceBackend, and Studio's dict
exchange through Bridge, against the real worker and real models."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from conftest import FAST, HELLO, greedy_text

from mlx_worker import Client, LoadFailedError, WorkerDiedError
from mlx_worker.studio import Bridge, MLXInferenceBackend

TOKEN = "hf_studio_secret_never_in_the_environment"
TIMING_KEYS = {
    "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
    "predicted_ms", "predicted_per_token_ms", "predicted_per_second", "cache_n",
}  # fmt: skip
# About 1500 tokens: three prefill chunks on a CPU (the worker stops at the next boundary).
LONG = [{"role": "user", "content": "Tell me about the history of computing. " * 180}]


def config(identifier: str, **flags) -> SimpleNamespace:
    """Studio's model config object."""
    return SimpleNamespace(**{"is_vision": False, "is_lora": False, "is_gguf": False, **flags}, identifier=identifier)


@pytest.fixture()
def backend(binary: str):
    b = MLXInferenceBackend(binary)
    yield b
    b.close()


def growing(texts: list[str]) -> bool:
    return all(b.startswith(a) and len(b) > len(a) for a, b in zip(texts, texts[1:]))


def consume_with_cancel(stream, cancel_event, after_s: float | None = None, after_items: int | None = None):
    """Reads ``stream``, setting ``cancel_event`` after ``after_s`` seconds (from a timer) or
    after ``after_items`` items; returns (items, seconds from the set to the stream's end)."""
    set_at: list[float] = []

    def fire() -> None:
        set_at.append(time.monotonic())
        cancel_event.set()

    if after_s is not None:
        threading.Timer(after_s, fire).start()
    items = []
    for item in stream:
        items.append(item)
        if after_items is not None and len(items) == after_items:
            fire()
    ended = time.monotonic()
    assert set_at, "the stream ended before the cancel"
    return items, ended - set_at[0]


def test_the_seeds_call_sequence(backend: MLXInferenceBackend, binary: str, smollm2: str, tiny_lora):
    assert (backend.device, backend.models, backend.active_model_name) == ("mlx", {}, None)
    with pytest.raises(RuntimeError, match="No model loaded"):
        next(backend.generate_chat_response(HELLO))

    # load with a config object; the token never enters os.environ.
    assert backend.load_model(config(smollm2), hf_token=TOKEN, **FAST) is True
    assert backend.active_model_name == smollm2 and backend.loading_models == set()
    assert backend.models[smollm2]["model_info"]["display_name"] == "SmolLM2-135M-Instruct"
    assert not any(TOKEN in value for value in os.environ.values())

    # The cumulative text only grows, and ends as the worker's own greedy text.
    texts = list(backend.generate_chat_response(HELLO, temperature=0.0, max_new_tokens=16))
    assert texts and growing(texts)
    assert texts[-1] == greedy_text(backend.client, HELLO, 16, model=smollm2)
    stats = backend.last_generation_stats
    assert set(stats) == {"usage", "timings"} and set(stats["timings"]) == TIMING_KEYS
    assert stats["usage"]["completion_tokens"] == stats["timings"]["predicted_n"] > 0

    # A cancel event set mid-prefill: the worker stops before any token; the generator ends
    # within 100 ms.
    event = threading.Event()
    items, lag = consume_with_cancel(
        backend.generate_chat_response(LONG, temperature=0.0, max_new_tokens=32, cancel_event=event), event, after_s=0.3
    )
    assert items == [] and lag < 0.1
    assert backend.wait_for_generation(timeout=60)
    result = backend.last_generation_result
    assert result["finish_reason"] == "cancelled" and result["usage"]["completion_tokens"] == 0

    # ... and mid-decode, with a multiprocessing Event.
    event = multiprocessing.Event()
    items, lag = consume_with_cancel(
        backend.generate_chat_response(HELLO, temperature=0.0, max_new_tokens=200, cancel_event=event), event, after_items=2
    )
    assert len(items) >= 2 and growing(items) and lag < 0.1
    assert backend.wait_for_generation(timeout=60)
    result = backend.last_generation_result
    assert result["finish_reason"] == "cancelled" and result["text"].startswith(items[-1])
    assert result["usage"]["completion_tokens"] < 200

    # Adapter control: use_adapter=False answers with the base weights, without a reload.
    with Client(binary) as plain:
        plain.load(tiny_lora.base)
        base_text = greedy_text(plain, HELLO, 12)
    assert backend.load_model(config(tiny_lora.adapter, is_lora=True, base_model=tiny_lora.base), load_in_4bit=False)
    assert backend.models[tiny_lora.adapter]["is_lora"]

    def adapter_text(use_adapter):
        gen = backend.generate_with_adapter_control(
            use_adapter=use_adapter, messages=HELLO, temperature=0.0, max_new_tokens=12
        )
        return list(gen)[-1]

    assert adapter_text(False) == base_text
    with_adapter = adapter_text(None)
    assert with_adapter != base_text and adapter_text(True) == with_adapter

    # unload, reset.
    assert backend.unload_model(tiny_lora.adapter) is True
    assert backend.active_model_name is None and tiny_lora.adapter not in backend.models
    assert [m["model_id"] for m in backend.client.status()["models"]] == [smollm2]
    backend.reset_generation_state()


def test_a_load_failure_leaves_the_backend_usable(backend: MLXInferenceBackend, smollm2: str):
    backend.load_model(config(smollm2), **FAST)
    with pytest.raises(LoadFailedError) as failed:
        backend.load_model(config(smollm2 + "-missing"), **FAST)
    assert failed.value.kind == "not_found"
    assert backend.active_model_name == smollm2 and backend.loading_models == set()
    assert list(backend.generate_chat_response(HELLO, temperature=0.0, max_new_tokens=4))


def test_a_killed_worker_gives_a_clear_error_and_the_next_load_works(backend: MLXInferenceBackend, smollm2: str):
    backend.load_model(config(smollm2), **FAST)
    stream = backend.generate_chat_response(HELLO, temperature=0.0, max_new_tokens=200)
    next(stream)
    os.kill(backend.client.pid, signal.SIGKILL)
    with pytest.raises(WorkerDiedError, match="killed by signal 9"):
        list(stream)
    assert backend.models == {} and backend.active_model_name is None
    assert backend.load_model(config(smollm2), **FAST)
    assert list(backend.generate_chat_response(HELLO, temperature=0.0, max_new_tokens=4))


def replies_until(bridge: Bridge, kind: str, timeout: float = 120) -> list[dict]:
    """Replies up to and including the first of type ``kind``."""
    out = []
    deadline = time.monotonic() + timeout
    while not out or out[-1]["type"] != kind:
        out.append(bridge.get(timeout=max(0.1, deadline - time.monotonic())))
        assert isinstance(out[-1]["ts"], float)
    return out


def test_the_bridge_speaks_studios_dicts(binary: str, smollm2: str):
    bridge = Bridge(binary)
    load = {"type": "load", "model_name": smollm2, "max_seq_length": 4096, "load_in_4bit": False,
            "hf_token": "", "trust_remote_code": False, "gpu_ids": None, "mlx_kv_bits": 8,
            "chat_template_override": None, "is_vision": False, "is_lora": False, "is_gguf": False,
            "audio_type": None}  # fmt: skip
    gen = {"type": "generate", "messages": HELLO, "system_prompt": "", "image_base64": None,
           "temperature": 0.0, "top_p": 0.95, "top_k": 20, "min_p": 0.01, "max_new_tokens": 16,
           "repetition_penalty": 1.0, "presence_penalty": 0.0}  # fmt: skip

    bridge.send(load)
    replies = replies_until(bridge, "loaded")
    assert all(r["type"] == "status" and r["message"] for r in replies[:-1]) and len(replies) > 1
    loaded = replies[-1]
    assert loaded["success"] is True
    info = loaded["model_info"]
    assert info["identifier"] == smollm2 and info["display_name"] == "SmolLM2-135M-Instruct"
    assert (info["is_mlx"], info["is_gguf"], info["is_audio"]) == (True, False, False)
    assert (info["mlx_kv_bits"], info["mlx_kv_bits_requested"], info["mlx_kv_quant_reason"]) == (8, 8, None)
    template = info["chat_template_info"]
    assert template["has_template"] and "<|im_start|>" in template["template"]
    assert template["special_tokens"]["eos"] == "<|im_end|>"

    # Two generates: tokens carry the cumulative text, gen_done the stats.
    for request_id in ("r1", "r2"):
        bridge.send({**gen, "request_id": request_id})
        replies = replies_until(bridge, "gen_done")
        tokens = [r["text"] for r in replies[:-1]]
        assert all(r["type"] == "token" and r["request_id"] == request_id for r in replies[:-1])
        assert tokens and growing(tokens)
        done = replies[-1]
        assert done["request_id"] == request_id and set(done["stats"]) == {"usage", "timings"}
        assert set(done["stats"]["timings"]) == TIMING_KEYS
    with Client(binary) as c:
        c.load(smollm2, kv_bits=8, **FAST)
        want = greedy_text(c, HELLO, 16, top_p=0.95, top_k=20, min_p=0.01)
    assert tokens[-1] == want

    # A cancel while generating: gen_done with fewer tokens.
    bridge.send({**gen, "request_id": "r3", "max_new_tokens": 200})
    first = bridge.get(timeout=60)
    assert first["type"] == "token"
    bridge.send({"type": "cancel"})
    replies = replies_until(bridge, "gen_done")
    assert replies[-1]["stats"]["usage"]["completion_tokens"] < 200

    # A generate still queued when an unload starts is answered cancelled; then unloaded.
    bridge.send({**gen, "request_id": "r4", "max_new_tokens": 64})
    bridge.send({**gen, "request_id": "r5"})
    bridge.send({"type": "unload", "model_name": smollm2})
    replies = replies_until(bridge, "unloaded")
    done = [r for r in replies if r["type"] == "gen_done"]
    assert {"type": "gen_done", "request_id": "r5", "cancelled": True, "stats": None}.items() <= done[-1].items()
    assert replies[-1]["model_name"] == smollm2

    bridge.send({"type": "reset"})
    assert replies_until(bridge, "reset_ack")[-1]["type"] == "reset_ack"
    bridge.send({"type": "status"})
    status = replies_until(bridge, "status_response")[-1]
    assert (status["active_model"], status["models"]) == (None, [])
    bridge.send({"type": "generate_audio", "request_id": "a1", "text": "hi"})
    error = replies_until(bridge, "error")[-1]
    assert "audio is not supported" in error["error"]
    bridge.send({**load, "model_name": smollm2 + "-missing"})
    failed = replies_until(bridge, "loaded")[-1]
    assert failed["success"] is False and "not_found" in failed["error"] and failed["stack"]
    bridge.send({"type": "shutdown"})
    assert list(bridge) == []
    with pytest.raises(EOFError):
        bridge.get(timeout=1)


def test_an_image_reaches_a_vision_model_in_every_form(backend: MLXInferenceBackend, binary: str, tiny_vision):
    """The seed's ``image`` as a path, bytes, base64 text or a PIL image: the same answer as the
    worker gives the image as a content part."""
    from PIL import Image

    png = tiny_vision.images / "gradient.png"
    assert backend.load_model(config(tiny_vision.model, is_vision=True), load_in_4bit=False)
    question = [{"role": "user", "content": "What is in this picture?"}]
    with Client(binary) as c:
        c.load(tiny_vision.model)
        parts = [{"type": "image", "image": str(png)}, {"type": "text", "text": "What is in this picture?"}]
        want = greedy_text(c, [{"role": "user", "content": parts}], 12)
        without = greedy_text(c, question, 12)
    assert want != without
    data = png.read_bytes()
    import base64

    for image in (str(png), data, base64.b64encode(data).decode(), Image.open(png)):
        texts = list(backend.generate_chat_response(question, image=image, temperature=0.0, max_new_tokens=12))
        assert texts and texts[-1] == want, type(image)


def test_a_distributed_load_splits_the_model_over_a_group_of_ranks(binary: str, smollm2: str):
    """Studio's ``mlx_distributed`` + ``mlx_parallel_mode`` on a worker started by mlx.launch
    (two ranks, ring backend on loopback): the same greedy answer as one process."""
    launcher = os.path.join(os.path.dirname(sys.executable), "mlx.launch")
    alone = MLXInferenceBackend(binary)
    group = MLXInferenceBackend(binary, launch=[launcher, "--backend", "ring", "-n", "2", "--"])
    try:
        alone.load_model(config(smollm2), load_in_4bit=False)
        split = config(smollm2, mlx_distributed=True, mlx_parallel_mode="pipeline")
        group.load_model(split, load_in_4bit=False)
        status = group.client.status()
        assert status["group"]["size"] == 2
        assert status["models"][0]["parallel"]["mode"] == "pipeline"
        answers = [greedy_text(b.client, HELLO, 24) for b in (alone, group)]
        assert answers[0] == answers[1] and answers[0]
    finally:
        alone.close()
        group.close()


def test_parallel_chats_run_together_and_answer_as_alone(binary: str, smollm2: str):
    """Studio's chats from several threads on one backend with ``--max-batch``: they run at the
    same time (the worker reports them in flight together) and each answers as it does alone."""
    questions = ["What is the capital of France?", "Write a haiku about rain.", "Name three fruits."]
    alone = MLXInferenceBackend(binary)
    together = MLXInferenceBackend(binary, worker_args=["--max-batch", "3"])
    try:
        expected = []
        for b in (alone, together):
            b.load_model(config(smollm2), load_in_4bit=False)
        for q in questions:
            *_, last = alone.generate_chat_response([{"role": "user", "content": q}], "", temperature=0.0, max_new_tokens=48)
            expected.append(last)
        answers: dict[int, str] = {}
        in_flight: list[int] = []

        def chat(i: int) -> None:
            for text in together.generate_chat_response(
                [{"role": "user", "content": questions[i]}], "", temperature=0.0, max_new_tokens=48
            ):
                answers[i] = text
                in_flight.append(together.client.status()["queue"]["running"])

        threads = [threading.Thread(target=chat, args=(i,)) for i in range(len(questions))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [answers[i] for i in range(len(questions))] == expected
        assert max(in_flight) > 1, in_flight
        assert together.client.initialize()["capabilities"]["max_batch"] == 3
    finally:
        alone.close()
        together.close()
