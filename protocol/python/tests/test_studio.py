"""mlx_worker.studio: the seed's call sequence on MLXInferenceBackend against the real worker
and real models. Studio 2026.10's own worker and orchestrator drive it in `cargo xtask studio`."""

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
from mlx_worker.studio import MLXInferenceBackend, parse_kv_quant, spec_mode

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
    entry = backend.models[smollm2]
    assert entry["load_result"]["info"]["display_name"] == "SmolLM2-135M-Instruct"
    assert (entry["context_length"], entry["native_context_length"]) == (FAST["max_seq_length"], 8192)
    assert entry["requested_context_length"] == FAST["max_seq_length"]
    assert entry["chat_template_info"]["format_type"] == "chatml"
    assert not any(TOKEN in value for value in os.environ.values())

    # The cumulative text only grows, and ends as the worker's own greedy text.
    texts = list(backend.generate_chat_response(HELLO, temperature=0.0, max_new_tokens=16))
    assert texts and growing(texts)
    assert texts[-1] == greedy_text(backend.client, HELLO, 16, model=smollm2)
    stats = backend.last_generation_stats
    assert set(stats) == {"usage", "timings", "finish_reason"} and set(stats["timings"]) == TIMING_KEYS
    assert stats["usage"]["completion_tokens"] == stats["timings"]["predicted_n"] > 0

    # A cancel event set mid-prefill: the worker stops before any token, at its next prefill
    # chunk; the generator ends once the worker has answered, its stats latched (Studio reads
    # them right after the generator ends).
    event = threading.Event()
    items, lag = consume_with_cancel(
        backend.generate_chat_response(LONG, temperature=0.0, max_new_tokens=32, cancel_event=event), event, after_s=0.3
    )
    assert items == [] and lag < 20
    result = backend.last_generation_result
    assert result["finish_reason"] == "cancelled" and result["usage"]["completion_tokens"] == 0

    # ... and mid-decode, with a multiprocessing Event.
    event = multiprocessing.Event()
    items, lag = consume_with_cancel(
        backend.generate_chat_response(HELLO, temperature=0.0, max_new_tokens=200, cancel_event=event), event, after_items=2
    )
    assert len(items) >= 2 and growing(items) and lag < 2
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


def test_studios_setting_strings_are_read_as_studio_reads_them():
    assert parse_kv_quant("auto") == parse_kv_quant(None) == parse_kv_quant("q8_0") == (None, False)
    assert parse_kv_quant("8") == (8, False) and parse_kv_quant(" TQ-3.5 ") == (3.5, True)
    assert parse_kv_quant("tq-4") == (4, True) and parse_kv_quant("tq-5") == (None, False)
    assert spec_mode(None) == spec_mode("bogus") == "auto" and spec_mode("none") == "off"
    assert spec_mode("draft-mtp") == "mtp" and spec_mode("NGRAM") == "ngram"
