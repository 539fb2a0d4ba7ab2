"""mlx_worker.Client and AsyncClient against the real worker and real models."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from conftest import FAST, HELLO, greedy_text

from mlx_worker import (
    AsyncClient,
    Client,
    InvalidParamsError,
    LoadFailedError,
    MethodNotFoundError,
    NoModelError,
    WorkerDiedError,
    WorkerError,
    WorkerNotFoundError,
)


def test_load_generate_and_the_other_calls(client: Client, smollm2: str):
    init = client.initialize(client={"name": "pytest", "version": "0"})
    assert init["protocol_version"] == "1" and init["capabilities"]["lora"]
    with pytest.raises(NoModelError):
        client.generate(HELLO, max_new_tokens=2).finish()

    progress = []
    loaded = client.load(smollm2, on_progress=progress.append, **FAST)
    assert [p["stage"] for p in progress][-1] == "ready"
    info = loaded["info"]
    assert info["display_name"] == "SmolLM2-135M-Instruct"
    assert "<|im_start|>" in info["chat_template"]["text"]
    assert info["special_tokens"]["eos"] == "<|im_end|>"
    assert info["kv_quantization"] == {"requested": None, "applied": None, "reason": None}

    # The deltas add up to the result; the iteration's value is the result.
    generation = client.generate(HELLO, temperature=0.0, max_new_tokens=16)
    deltas = list(generation)
    assert [d["index"] for d in deltas] == list(range(len(deltas)))
    assert "".join(d["text"] for d in deltas) == generation.result["text"]
    assert generation.result["usage"]["completion_tokens"] <= 16

    def collect():
        return (yield from client.generate(HELLO, temperature=0.0, max_new_tokens=16))

    assert list(d["text"] for d in collect()) == [d["text"] for d in deltas]

    tokens = client.tokenize(text="Hello world")
    assert tokens["count"] == len(tokens["tokens"]) > 0
    status = client.status()
    assert status["active_model"] == smollm2 and status["state"] == "idle"
    assert status["prompt_cache"]["lookups"] == 2 and "disk" not in status["prompt_cache"]

    # A named conversation: listed, pinned, forked, evicted.
    client.generate(HELLO, temperature=0.0, max_new_tokens=4, cache={"conversation_id": "c"}).finish()
    assert client.cache_pin("c") == {"pinned": True}
    forked = client.cache_fork("c", "c2", tokens=3)
    assert forked == {"tokens": 3}
    listed = client.cache_list()
    assert listed["model_id"] == smollm2
    named = {c["conversation_id"]: c for c in listed["conversations"] if c["conversation_id"]}
    assert named["c"]["pinned"] and named["c2"]["tokens"] == 3 and named["c"]["tier"] == "memory"
    assert client.cache_evict("c2") == {"evicted": 1}
    with pytest.raises(InvalidParamsError, match="cache_list"):
        client.cache_pin("nobody")

    # Errors are typed and the worker keeps serving.
    with pytest.raises(InvalidParamsError) as bad:
        client.generate(HELLO, top_p=2.0).finish()
    assert bad.value.field == "top_p" and bad.value.code == -32602
    with pytest.raises(LoadFailedError) as missing:
        client.load(smollm2 + "-missing")
    assert missing.value.kind == "not_found"
    with pytest.raises(MethodNotFoundError, match="audio is not supported"):
        client.call("generate_audio", {"text": "hi"})
    assert client.reset()["memory"]["active_bytes"] > 0
    assert client.unload()["unloaded"] == [smollm2]
    assert client.shutdown() == 0


def test_cancel_ends_a_generation_with_the_text_so_far(client: Client, smollm2: str):
    client.load(smollm2, **FAST)
    generation = client.generate(HELLO, temperature=0.0, max_new_tokens=200)
    first = next(generation)
    assert generation.cancel()
    rest = list(generation)
    result = generation.result
    assert result["finish_reason"] == "cancelled"
    assert result["text"] == first["text"] + "".join(d["text"] for d in rest)
    assert result["usage"]["completion_tokens"] < 200


def test_kv_bits_on_a_model_that_cannot_take_them(client: Client, tiny_lora, smollm2: str):
    # The tiny model's heads have 16 features: it loads with a plain cache and says why.
    plain = client.load(tiny_lora.base)
    text = greedy_text(client, HELLO, 8)
    loaded = client.load(tiny_lora.base, kv_bits=8)
    kv = loaded["info"]["kv_quantization"]
    assert (kv["requested"], kv["applied"]) == (8, None) and "multiple of 64" in kv["reason"]
    assert plain["info"]["kv_quantization"]["requested"] is None
    assert greedy_text(client, HELLO, 8) == text
    # SmolLM2's heads have 64: applied.
    kv = client.load(smollm2, kv_bits=8, **FAST)["info"]["kv_quantization"]
    assert kv == {"requested": 8, "applied": 8, "reason": None}


def test_reasoning_effort_and_preserve_thinking_reach_the_template(client: Client, tiny_lora):
    template = (
        "{% if reasoning_effort != 'high' or preserve_thinking != true %}"
        "{{ raise_exception('effort=' ~ reasoning_effort ~ ' preserve=' ~ preserve_thinking) }}"
        "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    client.load(tiny_lora.base, chat_template_override=template)
    # Undefined unless given (undefined renders as nothing).
    with pytest.raises(WorkerError, match=r"effort= preserve= \(JSON"):
        client.generate(HELLO, max_new_tokens=1).finish()
    with pytest.raises(WorkerError, match=r"effort=high preserve=False \(JSON"):
        client.generate(HELLO, max_new_tokens=1, reasoning_effort="high", preserve_thinking=False).finish()
    result = client.generate(HELLO, max_new_tokens=1, reasoning_effort="high", preserve_thinking=True).finish()
    assert result["usage"]["completion_tokens"] == 1


def test_a_killed_worker_raises_a_clear_error_and_the_next_load_starts_a_fresh_one(client: Client, smollm2: str):
    client.load(smollm2, **FAST)
    generation = client.generate(HELLO, temperature=0.0, max_new_tokens=200)
    next(generation)
    old_pid = client.pid
    os.kill(old_pid, signal.SIGKILL)
    with pytest.raises(WorkerDiedError) as died:
        list(generation)
    assert died.value.returncode == -signal.SIGKILL
    assert "killed by signal 9" in str(died.value)
    assert "MLX ready" in died.value.stderr_tail  # the tail of its log
    with pytest.raises(WorkerDiedError):
        client.status()
    assert client.load(smollm2, **FAST)["model_id"] == smollm2
    assert client.pid != old_pid and client.alive
    assert greedy_text(client, HELLO, 4)


def test_the_binary_is_found_or_a_clear_error(binary: str, monkeypatch):
    monkeypatch.setenv("MLX_WORKER_BIN", binary)
    with Client() as c:
        assert c.binary == binary
    monkeypatch.setenv("MLX_WORKER_BIN", "/nonexistent/mlx-worker")
    with pytest.raises(WorkerNotFoundError, match="MLX_WORKER_BIN"):
        Client()
    monkeypatch.delenv("MLX_WORKER_BIN")
    monkeypatch.setenv("PATH", os.path.dirname(binary))
    with Client() as c:
        assert os.path.samefile(c.binary, binary)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(WorkerNotFoundError, match="PATH"):
        Client()


def test_async_client_gives_the_same_greedy_text(binary: str, smollm2: str, client: Client):
    client.load(smollm2, **FAST)
    want = greedy_text(client, HELLO, 12)

    async def run() -> None:
        async with AsyncClient(binary) as c:
            progress = []
            await c.load(smollm2, on_progress=progress.append, **FAST)
            assert progress[-1]["stage"] == "ready"
            generation = await c.generate(HELLO, temperature=0.0, max_new_tokens=12)
            text = "".join([d["text"] async for d in generation])
            assert text == generation.result["text"] == want
            long = await c.generate(HELLO, temperature=0.0, max_new_tokens=200)
            await long.__anext__()
            assert await long.cancel()
            assert (await long.finish())["finish_reason"] == "cancelled"
            with pytest.raises(InvalidParamsError):
                await (await c.generate(HELLO, temperature=-1.0)).finish()
            assert (await c.status())["state"] == "idle"
            # A killed worker: a clear error, and the next load starts a fresh one.
            dying = await c.generate(HELLO, temperature=0.0, max_new_tokens=200)
            await dying.__anext__()
            os.kill(c.pid, signal.SIGKILL)
            with pytest.raises(WorkerDiedError, match="killed by signal 9"):
                await dying.finish()
            await c.load(smollm2, **FAST)
            assert c.alive and (await c.status())["active_model"] == smollm2
            assert await c.shutdown() == 0

    asyncio.run(run())


GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
    "<end_of_turn>\n{% endfor %}<start_of_turn>model\n"
)


def test_gemma3_with_a_chat_template_override(client: Client, gemma3: str):
    # The base model has no chat template of its own: the override's text is the one reported.
    info = client.load(gemma3, chat_template_override=GEMMA_TEMPLATE)["info"]
    assert info["model_type"] == "gemma3_text" and info["display_name"] == "gemma-3-270m"
    assert info["chat_template"] == {"present": True, "source": "override", "text": GEMMA_TEMPLATE}
    assert info["special_tokens"]["bos"] == "<bos>"
    result = client.generate(HELLO, temperature=0.0, max_new_tokens=8).finish()
    assert result["usage"]["completion_tokens"] > 0
