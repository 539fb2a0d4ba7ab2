"""Studio's own code on mlx-worker: the scenarios of `cargo xtask studio`.

Each scenario runs through Studio 2026.10.9's published code, patched by
`studio-2026.10.9.patch` (one import line) and nothing else:
- "worker": Studio's inference child, `core.inference.worker.run_inference_process`, spawned as
  Studio's orchestrator spawns it (spawn context, its two queues, the cancel and drain events,
  its `StopLedger` and `PendingTeardowns`, the spawn-time config dict of
  `orchestrator.py` `load_model`), fed the command dicts the orchestrator sends;
- "orchestrator": Studio's `InferenceOrchestrator`, through the methods its routes call.
The only run-time facts forced are the hardware answers in `site/sitecustomize.py`.

Env: MLX_WORKER_SMOLLM2_DIR, MLX_WORKER_GEMMA3_DIR, MLX_WORKER_TINY_LORA_DIR (a dir holding
`adapter/`), MLX_WORKER_VISION_MODEL (a tiny vision model dir), MLX_WORKER_TINY_GPT_OSS (a
tiny random gpt-oss on SmolLM2's tokenizer). Prints the table; exit 1 on a
failure. `--only NAME` runs the scenarios whose name contains NAME.
"""

from __future__ import annotations

import base64
import io
import json
import multiprocessing as mp
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import traceback
import uuid
from types import SimpleNamespace

import core.inference.worker as W  # Studio's worker module (patched: mlx_worker's backend)

# The spawned children (Studio's inference processes) take MLX; this process stays as it is.
os.environ["STUDIO_MLX_CHILD"] = "1"

SMOLLM2 = os.environ["MLX_WORKER_SMOLLM2_DIR"]
GEMMA3 = os.environ["MLX_WORKER_GEMMA3_DIR"]
TINY_LORA = os.environ["MLX_WORKER_TINY_LORA_DIR"]
VISION = os.environ["MLX_WORKER_VISION_MODEL"]
TINY_GPT_OSS = os.environ["MLX_WORKER_TINY_GPT_OSS"]
TINY_QWEN3_5 = os.environ["MLX_WORKER_TINY_QWEN3_5"]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
LONG = [{"role": "user", "content": "Tell me a long story about a dragon. " * 200}]


class Failed(AssertionError):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise Failed(what)


# -- through Studio's worker child ------------------------------------------------------------


def spawn_config(model_name: str, **overrides) -> dict:
    """The spawn-time config dict as `InferenceOrchestrator.load_model` builds it
    (orchestrator.py, `sub_config`), with Studio's route defaults for an MLX load."""
    config = {
        "model_name": model_name, "max_seq_length": 0, "load_in_4bit": False, "hf_token": "",
        "gguf_variant": None, "trust_remote_code": False,
        "approved_remote_code_fingerprint": None, "subject": None, "gpu_ids": None,
        "tensor_parallel": False, "mlx_distributed": False, "mlx_parallel_mode": None,
        "mlx_kv_quant": None, "mlx_int8_prefill": False, "mlx_offload": (None, None),
        "speculative_type": None, "spec_draft_n_max": None, "spec_draft_model": None,
        "spec_drafters_allowed": None, "chat_template_override": None, "audio_device": None,
        "resolved_gpu_ids": None, "gpu_selection": {"selection_mode": "non_accelerator"},
        "device_backend": "cpu", "disable_xet": False,
    }  # fmt: skip
    config.update(overrides)
    return config


class Child:
    """Studio's inference child, started as the orchestrator's `_spawn_subprocess` starts it."""

    def __init__(self, config: dict):
        ctx = mp.get_context("spawn")
        self.cmd, self.resp = ctx.Queue(), ctx.Queue()
        self.cancel, self.drain = ctx.Event(), ctx.Event()
        self.ledger, self.pending = W.StopLedger(ctx), W.PendingTeardowns(ctx)
        self.proc = ctx.Process(
            target=W.run_inference_process,
            kwargs=dict(
                cmd_queue=self.cmd, resp_queue=self.resp, cancel_event=self.cancel, config=config,
                drain_event=self.drain, stop_ledger=self.ledger, pending_teardowns=self.pending,
            ),
            daemon=True,
        )  # fmt: skip
        self.proc.start()
        self.loaded = self.wait("loaded", timeout=300)

    def wait(self, kind: str, request_id=None, timeout: float = 120, seen: list | None = None) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = self.resp.get(timeout=0.2)
            except queue.Empty:
                continue
            if seen is not None:
                seen.append(reply)
            if reply.get("type") == kind and (request_id is None or reply.get("request_id") == request_id):
                return reply
            if reply.get("type") in ("error", "gen_error") and kind not in ("error", "gen_error"):
                raise Failed(f"{reply.get('type')}: {reply.get('error')}")
        raise Failed(f"no {kind} within {timeout} s")

    def generate(self, messages=QUESTION, **fields) -> tuple[dict, list[str]]:
        """One generate as the orchestrator's `_build_generate_cmd` sends it; returns the final
        reply and the streamed texts."""
        command = generate_command(messages, **fields)
        self.cmd.put(command)
        seen: list = []
        kind = fields.pop("_expect", "gen_done")
        done = self.wait(kind, command["request_id"], seen=seen)
        tokens = [r["text"] for r in seen if r.get("type") == "token" and r.get("request_id") == command["request_id"]]
        return done, tokens

    def close(self) -> None:
        self.pending.sending()
        self.cmd.put({"type": "shutdown"})
        self.proc.join(15)
        if self.proc.is_alive():
            self.proc.kill()


def generate_command(messages, **fields) -> dict:
    command = {
        "type": "generate", "request_id": str(uuid.uuid4()), "messages": messages,
        "system_prompt": "", "image_base64": None, "images_base64": None, "image_ordinal": None,
        "temperature": 0.0, "top_p": 0.95, "top_k": 20, "min_p": 0.01, "max_new_tokens": 24,
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "logit_bias": None, "parallel_slots": 1,
    }  # fmt: skip
    command.update({k: v for k, v in fields.items() if not k.startswith("_")})
    return command


def cumulative(texts: list[str]) -> bool:
    return all(b.startswith(a) for a, b in zip(texts, texts[1:]))


GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def studio_adapter() -> str:
    """The tiny LoRA fixture's adapter as a trained one reaches Studio: a folder whose
    adapter_config.json names its base (PEFT's `base_model_name_or_path`, mlx-lm's `model`)."""
    import shutil

    folder = os.path.join(os.environ["HOME"], "tiny-lora-adapter")
    if not os.path.isdir(folder):
        shutil.copytree(os.path.join(TINY_LORA, "adapter"), folder)
        path = os.path.join(folder, "adapter_config.json")
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        config.update(base_model_name_or_path=TINY_LORA, model=TINY_LORA)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
    return folder


# ChatML that renders tools and opens a thought in its generation prompt (templates with
# thinking on do), for SmolLM2 given `<think>` tokens.
THINKING = (
    "{% if tools %}<|im_start|>system\n# Tools\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n<think>\n"
)
# gpt-oss's harmony prompt: tools in a developer message, the generation prompt
# `<|start|>assistant`; the model answers on channels (analysis, final).
HARMONY = (
    "<|start|>system<|message|>Reasoning: low\n\n# Valid channels: analysis, commentary, final.<|end|>"
    "{% for m in messages %}<|start|>{{ m.role }}{% if m.role == 'assistant' %}<|channel|>final{% endif %}"
    "<|message|>{{ m.content }}<|end|>{% endfor %}<|start|>assistant"
)
# Harmony's marker tokens, given the ids of SmolLM2's unused added tokens (the tiny gpt-oss
# uses SmolLM2's tokenizer); its `<|return|>`, `<|call|>` and SmolLM2's eos end a reply.
HARMONY_TOKENS = [(3, "<|start|>"), (4, "<|end|>"), (5, "<|message|>"), (6, "<|channel|>"), (7, "<|constrain|>"), (8, "<|return|>"), (9, "<|call|>")]
TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "The time in a zone.",
          "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}]


def renamed(model: str, name: str, renames, special: bool, eos=None) -> str:
    """A copy of `model` (weights linked) whose tokenizer's added tokens are renamed: a real
    tokenizer given a family's markup (`<think>`, harmony's markers)."""
    folder = os.path.join(os.environ["HOME"], name)
    if os.path.isdir(folder):
        return folder
    os.makedirs(folder)
    for file in os.listdir(model):
        source = os.path.join(model, file)
        if file.endswith(".safetensors"):
            os.symlink(source, os.path.join(folder, file))
        elif file != "tokenizer.json" and os.path.isfile(source):
            with open(source, "rb") as f, open(os.path.join(folder, file), "wb") as g:
                g.write(f.read())
    with open(os.path.join(model, "tokenizer.json"), encoding="utf-8") as f:
        tokenizer = json.load(f)
    for token_id, new in renames:
        added = tokenizer["added_tokens"][token_id]
        assert added["id"] == token_id
        old, added["content"], added["special"] = added["content"], new, special
        del tokenizer["model"]["vocab"][old]
        tokenizer["model"]["vocab"][new] = token_id
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f)
    if eos is not None:
        with open(os.path.join(folder, "generation_config.json"), "w", encoding="utf-8") as f:
            json.dump({"eos_token_id": eos}, f)
    return folder


def png_base64() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def worker_smollm2(results: dict) -> None:
    """The SmolLM2 scenarios through Studio's worker child, one child for them all."""
    child = Child(spawn_config(SMOLLM2, mlx_kv_quant="tq-3.5", speculative_type="mtp", spec_draft_n_max=4))
    try:
        def load():
            loaded = child.loaded
            check(loaded.get("success") is True, f"loaded: {loaded}")
            info = loaded["model_info"]
            check(info["context_length"] == 8192 and info["native_context_length"] == 8192, f"context: {info}")
            check(info["mlx_kv_quant_eligibility"] == "refused" and info["mlx_kv_quant_requested"] == "tq-3.5", str(info))
            check(info["spec_drafter_kind"] == "ngram" and info["spec_fallback_reason"] == "drafter_not_found", str(info))
            template = info["chat_template_info"]
            check(template["format_type"] == "chatml" and "<|im_start|>" in template["template"], str(template))
            check(template["special_tokens"].get("eos_token") == "<|im_end|>", str(template))

        def chat():
            done, tokens = child.generate()
            check(len(tokens) > 3 and cumulative(tokens), f"tokens: {tokens}")
            stats = done["stats"]
            check(stats["usage"]["completion_tokens"] > 0 and "prompt_tokens_details" in stats["usage"], str(stats))
            check(stats["finish_reason"] in ("stop", "length"), str(stats))
            check("Paris" in tokens[-1], tokens[-1])

        def options():
            one, t1 = child.generate(temperature=1.0, seed=7)
            two, t2 = child.generate(temperature=1.0, seed=7)
            check(t1[-1] == t2[-1], f"seeded replies differ: {t1[-1]!r} {t2[-1]!r}")
            _, plain = child.generate()
            word = plain[-1].split()[1]
            _, stopped = child.generate(stop=[word])
            check(word not in stopped[-1] and plain[-1].startswith(stopped[-1]), f"stop {word!r}: {stopped[-1]!r}")
            _, shaped = child.generate(response_format={"type": "json_object"}, max_new_tokens=48)
            check(shaped[-1].lstrip().startswith("{"), f"json_object: {shaped[-1]!r}")
            with open(os.path.join(SMOLLM2, "tokenizer.json"), encoding="utf-8") as f:
                paris = json.load(f)["model"]["vocab"]["\u0120Paris"]  # " Paris"
            _, biased = child.generate(logit_bias={str(paris): -100.0})
            check("Paris" not in biased[-1], f"logit_bias: {biased[-1]!r}")

        def count_tokens():
            child.cmd.put({"type": "count_tokens", "request_id": "c1", "messages": QUESTION, "system_prompt": ""})
            plain = child.wait("count_tokens_response", "c1")
            child.cmd.put({"type": "count_tokens", "request_id": "c2", "messages": QUESTION, "system_prompt": "Answer in French."})
            system = child.wait("count_tokens_response", "c2")
            # The count is the prompt generate runs (SmolLM2's template writes its own system
            # prompt when none is given, so a short one counts fewer tokens).
            for counted, system_prompt in ((plain, ""), (system, "Answer in French.")):
                done, _ = child.generate(system_prompt=system_prompt, max_new_tokens=1)
                check(counted.get("input_tokens") == done["stats"]["usage"]["prompt_tokens"], f"{counted} {done['stats']}")
            check(plain["input_tokens"] != system["input_tokens"], f"{plain} {system}")

        def cancel_ledger_prefill():
            command = generate_command(LONG, max_new_tokens=200)
            child.cmd.put(command)
            time.sleep(0.5)  # the prompt of about 2000 tokens is prefilling
            started = time.monotonic()
            child.ledger.stop(command["request_id"])
            done = child.wait("gen_done", command["request_id"])
            # Heard between two prefill chunks (of 512 tokens: seconds on a 2-core CPU).
            check(time.monotonic() - started < 20.0, "stop took over 20 s")
            check(done["stats"] is not None and done["stats"]["usage"]["completion_tokens"] == 0, str(done))

        def cancel_event_decode():
            # The end-of-turn token banned: only the stop ends this reply before 400 tokens.
            command = generate_command(QUESTION, max_new_tokens=400, logit_bias={"2": -100.0})
            child.cmd.put(command)
            seen: list = []
            child.wait("token", command["request_id"], seen=seen)
            child.cancel.set()
            done = child.wait("gen_done", command["request_id"], seen=seen)
            check(done["stats"] is not None and done["stats"]["usage"]["completion_tokens"] < 100, str(done["stats"]))

        def raw_completion():
            child.cmd.put({"type": "resolve_prompt", "request_id": "r1", "prompt": "The capital of France is"})
            resolved = child.wait("resolve_prompt_response", "r1")
            check(resolved.get("ids") and resolved.get("n_vocab") == 49152, str(resolved))
            done, tokens = child.generate(messages=[], prompt_ids=resolved["ids"], max_new_tokens=8)
            check(tokens and "Paris" in tokens[-1], f"completion: {tokens}")

        def rows():
            command = generate_command(QUESTION, rows=[{}, {"seed": 3, "temperature": 1.0}], parallel_slots=2)
            child.cmd.put(command)
            seen: list = []
            child.wait("gen_done", command["request_id"], seen=seen)
            done_rows = [r for r in seen if r.get("type") == "row_done"]
            check(sorted(r["row"] for r in done_rows) == [0, 1], str(done_rows))
            check(all(r["stats"]["usage"]["completion_tokens"] > 0 for r in done_rows), str(done_rows))

        def reset_keeps_cache():
            turn = QUESTION + [{"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Spain?"}]
            child.generate(messages=turn)
            child.pending.sending()
            child.cmd.put({"type": "reset"})
            child.wait("reset_ack")
            done, _ = child.generate(messages=turn + [{"role": "assistant", "content": "Madrid."}, {"role": "user", "content": "And Italy?"}])
            check(done["stats"]["usage"]["prompt_tokens_details"]["cached_tokens"] > 20, str(done["stats"]))

        def over_long():
            reply, _ = child.generate(messages=[{"role": "user", "content": "word " * 9000}], _expect="gen_error")
            budget = reply.get("context_budget") or {}
            check(budget.get("context_tokens") == 8192 and budget.get("request_tokens", 0) > 8192, str(reply)[:300])
            check("Message too long" in reply["error"], reply["error"][:200])

        def unload_and_status():
            child.cmd.put({"type": "status"})
            status = child.wait("status_response")
            check(status["active_model"] == SMOLLM2 and SMOLLM2 in status["models"], str(status)[:300])
            child.pending.sending()
            child.cmd.put({"type": "unload", "model_name": SMOLLM2})
            child.wait("unloaded")
            child.cmd.put({"type": "status"})
            check(child.wait("status_response")["models"] == {}, "models left after unload")

        for name, run in [
            ("load: Studio's keywords, fields, refusals", load), ("streamed chat", chat),
            ("seed, stop, response_format, logit_bias", options), ("count_tokens", count_tokens),
            ("stop by StopLedger mid-prefill", cancel_ledger_prefill),
            ("stop by shared event mid-decode", cancel_event_decode), ("raw completion", raw_completion),
            ("n > 1 rows", rows), ("reset keeps the prompt cache", reset_keeps_cache),
            ("over-long prompt", over_long), ("status, unload", unload_and_status),
        ]:  # fmt: skip
            results[(f"SmolLM2: {name}", "worker")] = attempt(run)
    finally:
        child.close()


def worker_other_models(results: dict) -> None:
    def gemma3():
        # The base checkpoint has no chat template: Studio's override supplies one.
        child = Child(spawn_config(GEMMA3, mlx_kv_quant="8", chat_template_override=GEMMA_TEMPLATE))
        try:
            info = child.loaded["model_info"]
            check(info["mlx_kv_quant_eligibility"] in ("full", "partial") and info["mlx_kv_bits"] == 8, str(info))
            check(info["chat_template_override_requested"] == GEMMA_TEMPLATE, str(info))
            check(info["chat_template_info"]["format_type"] == "custom", str(info["chat_template_info"]))
            _, tokens = child.generate()
            check(tokens and cumulative(tokens), str(tokens))
        finally:
            child.close()

    def lora():
        child = Child(spawn_config(studio_adapter()))
        try:
            check(child.loaded.get("success") is True, str(child.loaded)[:600])
            check(child.loaded["model_info"]["is_lora"] is True, str(child.loaded["model_info"]))
            _, on = child.generate(max_new_tokens=12)
            _, off = child.generate(max_new_tokens=12, use_adapter=False)
            _, on_again = child.generate(max_new_tokens=12, use_adapter=True)
            check(on[-1] == on_again[-1] and on[-1] != off[-1], f"on {on[-1]!r} off {off[-1]!r}")
        finally:
            child.close()

    def vision():
        child = Child(spawn_config(VISION))
        try:
            check(child.loaded["model_info"]["is_vision"] is True, str(child.loaded["model_info"]))
            image = png_base64()
            done, tokens = child.generate(messages=[{"role": "user", "content": "What is this?"}], image_base64=image, max_new_tokens=6)
            with_image = done["stats"]["usage"]["prompt_tokens"]
            done, _ = child.generate(messages=[{"role": "user", "content": "What is this?"}], max_new_tokens=6)
            check(with_image > done["stats"]["usage"]["prompt_tokens"] + 8, f"{with_image} vs {done['stats']['usage']}")
            done, _ = child.generate(messages=[{"role": "user", "content": "What is this?"}], images_base64=[image], max_new_tokens=6)
            check(done["stats"]["usage"]["prompt_tokens"] == with_image, f"images_base64: {done['stats']['usage']} vs {with_image}")
        finally:
            child.close()

    def thinking_and_tools():
        model = renamed(SMOLLM2, "smollm2-think", [(11, "<think>"), (12, "</think>")], False)
        child = Child(spawn_config(model, chat_template_override=THINKING))
        try:
            # The template opened the thought: the reply starts inside it. A bias on `</think>`
            # makes the 135M model (which never learnt these tokens) close it at once: one
            # token, `</think>`, after the `<think>` the prompt holds.
            _, texts = child.generate(logit_bias={"12": 100.0}, max_new_tokens=1)
            check(texts == ["<think></think>"], f"{texts}")
            _, texts = child.generate(max_new_tokens=8)
            check(cumulative(texts) and texts[0].startswith("<think>") and texts[-1].count("<think>") == 1, f"{texts}")
            # Tools reach the template: counted and generated with them.
            for rid, tools in (("t0", None), ("t1", TOOLS)):
                child.cmd.put({"type": "count_tokens", "request_id": rid, "messages": QUESTION, "system_prompt": "", "tools": tools})
            without, with_tools = child.wait("count_tokens_response", "t0"), child.wait("count_tokens_response", "t1")
            done, _ = child.generate(tools=TOOLS, max_new_tokens=4)
            check(with_tools["input_tokens"] > without["input_tokens"] + 20, f"{without} {with_tools}")
            check(done["stats"]["usage"]["prompt_tokens"] == with_tools["input_tokens"], str(done["stats"]["usage"]))
        finally:
            child.close()

    def harmony():
        model = renamed(TINY_GPT_OSS, "tiny-gpt-oss-harmony", HARMONY_TOKENS, True, eos=[8, 9, 2])
        child = Child(spawn_config(model, chat_template_override=HARMONY))
        try:
            schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"], "additionalProperties": False}
            # Biases on `<|end|>` and `analysis` make the random model open an analysis and end it.
            _, texts = child.generate(
                response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
                logit_bias={"4": 100.0, "14975": 100.0}, max_new_tokens=200,
            )
            check(cumulative(texts) and texts[-1].startswith("<think>"), f"{texts[-1:]}")
            thought, closed, answer = texts[-1].partition("</think>")
            check(closed and json.loads(answer)["city"] in ("Paris", "Rome"), f"{texts[-1]!r}")
            check("<|" not in texts[-1], f"markers in the text: {texts[-1]!r}")
        finally:
            child.close()

    def dflash():
        # A DFlash block drafter beside the tiny Qwen3.5 (made with mlx-vlm's `qwen3_dflash`
        # class, saved as z-lab's releases are), named as Studio's `spec_draft_model`: drafts
        # under `dflash` and `auto`, the same reply as without; under `dspark` it is refused by
        # kind. DFlash2, DSpark and EAGLE-3 companions draft under `dflash`, `dspark`, `eagle3`.
        drafter = os.path.join(TINY_QWEN3_5, "dflash")
        replies = []
        # DFlash2 is reported as `dflash`, as Studio reports it.
        runs = [("dflash", "dflash", "dflash"), ("dflash", "auto", "dflash"), ("dflash", "off", None),
                ("dflash2", "dflash", "dflash"), ("dspark", "dspark", "dspark"), ("eagle3", "eagle3", "eagle3")]
        for name, mode, kind in runs:
            config = spawn_config(TINY_QWEN3_5, speculative_type=mode, spec_draft_model=os.path.join(TINY_QWEN3_5, name))
            child = Child(config)
            try:
                info = child.loaded["model_info"]
                check(info["spec_drafter_kind"] == kind and info["spec_fallback_reason"] is None, str(info))
                _, tokens = child.generate(max_new_tokens=12)
                check(tokens and cumulative(tokens), str(tokens))
                replies.append(tokens[-1])
            finally:
                child.close()
        check(len(set(replies)) == 1, f"replies differ: {replies!r}")
        child = Child(spawn_config(TINY_QWEN3_5, speculative_type="dspark", spec_draft_model=drafter))
        try:
            info = child.loaded["model_info"]
            check(info["spec_drafter_kind"] == "ngram" and info["spec_fallback_reason"] == "drafter_incompatible", str(info))
        finally:
            child.close()

    def discovered():
        # No `spec_draft_model`: a DFlash companion named for the model (z-lab's naming,
        # `<model>-DFlash`) in the local Hugging Face cache is found by Studio's own discovery
        # (`discover_companions`) and drafts under `dflash`; under `dspark` none of that kind is
        # cached, and outside `spec_drafters_allowed` it is not looked at.
        hub = tempfile.mkdtemp(prefix="studio-hub-")
        repo = f"z-lab/{os.path.basename(TINY_QWEN3_5.rstrip('/'))}-DFlash"
        folder = os.path.join(hub, "models--" + repo.replace("/", "--"))
        snapshot = os.path.join(folder, "snapshots", "0" * 40)
        os.makedirs(snapshot)
        os.makedirs(os.path.join(folder, "refs"))
        with open(os.path.join(folder, "refs", "main"), "w") as ref:
            ref.write("0" * 40)
        source = os.path.join(TINY_QWEN3_5, "dflash")
        for file in os.listdir(source):
            os.symlink(os.path.join(source, file), os.path.join(snapshot, file))
        saved = {k: os.environ.get(k) for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE")}
        os.environ.update(HF_HUB_CACHE=hub, HF_HUB_OFFLINE="1")
        runs = [("dflash", None, "dflash", None), ("dspark", None, "ngram", "drafter_not_found"),
                ("dflash", ["other/drafter"], "ngram", "drafter_not_found")]
        try:
            for mode, allowed, kind, reason in runs:
                config = spawn_config(TINY_QWEN3_5, speculative_type=mode, spec_drafters_allowed=allowed)
                child = Child(config)
                try:
                    info = child.loaded["model_info"]
                    check(info["spec_drafter_kind"] == kind and info["spec_fallback_reason"] == reason, str(info))
                    check(info["spec_draft_model"] is None, str(info))
                    _, tokens = child.generate(max_new_tokens=12)
                    check(tokens and cumulative(tokens), str(tokens))
                finally:
                    child.close()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            shutil.rmtree(hub, ignore_errors=True)

    def mtp():
        # Qwen3.5 with its own multi-token-prediction head (the tiny fixture's, made with
        # mlx-vlm's drafter class): Studio's `mtp` mode drafts with it; `auto` on this text-only
        # model drafts with nothing, as Studio's `speculates_on_route` decides.
        for mode, kind in (("mtp", "mtp"), ("auto", None)):
            child = Child(spawn_config(TINY_QWEN3_5, speculative_type=mode))
            try:
                info = child.loaded["model_info"]
                check(info["spec_drafter_kind"] == kind and info["spec_fallback_reason"] is None, str(info))
                _, tokens = child.generate(max_new_tokens=12)
                check(tokens and cumulative(tokens), str(tokens))
            finally:
                child.close()
        child = Child(spawn_config(TINY_QWEN3_5, speculative_type="off"))
        try:
            check(child.loaded["model_info"]["spec_drafter_kind"] is None, str(child.loaded["model_info"]))
            _, plain = child.generate(max_new_tokens=12)
            check(plain[-1] == tokens[-1], f"with the head {tokens[-1]!r}, without {plain[-1]!r}")
        finally:
            child.close()

    def memory_budget():
        # Weights of 0.54 GB (float32) under a 1.04 GB limit: 8192 tokens need 0.69 GB beside
        # them, so the load fits the context to what fits; under 0.70 GB a long prompt is
        # refused as Studio refuses one over its context budget, and the child goes on.
        for limit, check_child in ((1_040_000_000, fitted), (700_000_000, refused)):
            os.environ["MLX_WORKER_MEMORY_LIMIT"] = str(limit)
            try:
                child = Child(spawn_config(SMOLLM2))
            finally:
                del os.environ["MLX_WORKER_MEMORY_LIMIT"]
            try:
                check_child(child)
            finally:
                child.close()

    def fitted(child: Child):
        info = child.loaded["model_info"]
        fitted_to = info.get("context_length_fitted")
        check(fitted_to is not None and 4096 <= fitted_to < 8192 and fitted_to % 256 == 0, str(info)[:600])
        check(info["context_length"] == fitted_to == info["mlx_context_budget"], str(info)[:600])
        _, tokens = child.generate()
        check("Paris" in tokens[-1], str(tokens))

    def refused(child: Child):
        check(child.loaded["model_info"].get("context_length_fitted") is None, str(child.loaded)[:600])
        reply, _ = child.generate(messages=[{"role": "user", "content": "word " * 3000}], _expect="gen_error")
        budget = reply.get("context_budget") or {}
        check(0 < budget.get("context_tokens", 0) < budget.get("request_tokens", 0), str(reply)[:400])
        check("Message too long" in reply["error"], reply["error"][:200])
        _, tokens = child.generate()
        check("Paris" in tokens[-1], str(tokens))

    results[("SmolLM2 under a memory limit: context fitted, long prompt refused", "worker")] = attempt(memory_budget)
    results[("Gemma 3 270M: load with 8-bit KV, chat", "worker")] = attempt(gemma3)
    results[("Qwen3.5: its own MTP head as Studio's mtp drafter, not auto's on text", "worker")] = attempt(mtp)
    results[("Qwen3.5: DFlash, DFlash2, DSpark and EAGLE-3 companions as Studio's drafters", "worker")] = attempt(dflash)
    results[("Qwen3.5: a DFlash companion found in the hub cache by Studio's discovery", "worker")] = attempt(discovered)
    results[("thinking (template opens <think>), tools", "worker")] = attempt(thinking_and_tools)
    results[("gpt-oss harmony: analysis as <think>, final answer", "worker")] = attempt(harmony)
    results[("LoRA: adapter on, off, on", "worker")] = attempt(lora)
    results[("vision: images through image_base64 / images_base64", "worker")] = attempt(vision)


# -- through Studio's orchestrator ------------------------------------------------------------


def orchestrator(results: dict) -> None:
    from core.inference.orchestrator import InferenceOrchestrator

    orch = InferenceOrchestrator()

    def load():
        check(orch.load_model(SimpleNamespace(identifier=SMOLLM2), max_seq_length=0, load_in_4bit=False, mlx_kv_quant="8") is True, "load_model")
        entry = orch.models[orch.active_model_name]
        check(entry["context_length"] == 8192 and entry["mlx_kv_quant_requested"] == "8", str(entry)[:300])

    def chat():
        holder: dict = {}
        texts = list(orch.generate_chat_response(QUESTION, temperature=0.0, max_new_tokens=24, stats_holder=holder))
        check(texts and cumulative(texts) and "Paris" in texts[-1], str(texts[-3:]))
        check(holder["stats"]["usage"]["completion_tokens"] > 0, str(holder))

    def stop():
        event = threading.Event()
        texts: list = []

        def read():
            for text in orch.generate_chat_response(LONG, temperature=0.0, max_new_tokens=300, cancel_event=event):
                texts.append(text)

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.5)  # mid-prefill
        started = time.monotonic()
        event.set()
        orch.reset_generation_state(event)
        reader.join(30)
        check(not reader.is_alive() and time.monotonic() - started < 20.0, "the stopped stream did not end")
        check(not texts, f"tokens after a stop mid-prefill: {texts[-1:]}")

    def count():
        n, model = orch.count_chat_tokens(QUESTION, "")
        check(n > 5 and model == SMOLLM2, f"{n} {model}")

    def parallel_chats():
        questions = [QUESTION, [{"role": "user", "content": "Name three fruits."}]]
        alone = [list(orch.generate_chat_response(q, temperature=0.0, max_new_tokens=40))[-1] for q in questions]
        seen: dict[int, list] = {0: [], 1: []}

        def chat(i: int) -> None:
            for text in orch.generate_chat_response(questions[i], temperature=0.0, max_new_tokens=40):
                seen[i].append((time.monotonic(), text))

        threads = [threading.Thread(target=chat, args=(i,)) for i in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        check([seen[i][-1][1] for i in (0, 1)] == alone, f"{[seen[i][-1][1] for i in (0, 1)]} vs alone {alone}")
        first_ends, second_starts = min(seen[i][-1][0] for i in (0, 1)), max(seen[i][0][0] for i in (0, 1))
        check(second_starts < first_ends, "the chats did not stream at the same time")

    def batch():
        holder: dict = {}
        alone = list(orch.generate_chat_response(QUESTION, temperature=0.0, max_new_tokens=16))[-1]
        events = list(orch.generate_chat_batch([{}, {"seed": 5, "temperature": 1.0}], QUESTION, temperature=0.0, max_new_tokens=16, stats_holder=holder))
        ended = [row for row, text in events if text is None]
        last = {row: text for row, text in events if text is not None}
        check(sorted(ended) == [0, 1] and last.get(0) == alone and last.get(1), f"{last} vs {alone!r}")
        check(all(s and s["usage"]["completion_tokens"] > 0 for s in holder["stats"]), str(holder))

    def completion():
        resolved = orch.resolve_completion_prompt("The capital of France is")
        texts = list(orch.generate_completion(resolved["ids"], temperature=0.0, max_new_tokens=8))
        check(texts and "Paris" in texts[-1], str(texts))

    def reload_on_settings():
        from routes.inference import _mlx_runtime_settings_match
        from models.inference import LoadRequest

        same = LoadRequest(model_path=SMOLLM2, mlx_kv_quant="8", max_seq_length=0)
        other = LoadRequest(model_path=SMOLLM2, mlx_kv_quant="4", max_seq_length=0)
        check(_mlx_runtime_settings_match(orch, same) is True, "same settings would reload")
        check(_mlx_runtime_settings_match(orch, other) is False, "new KV bits would not reload")
        check(orch.load_model(SimpleNamespace(identifier=SMOLLM2), max_seq_length=0, load_in_4bit=False, mlx_kv_quant="4") is True, "reload")
        check(orch.models[orch.active_model_name]["mlx_kv_quant_requested"] == "4", "reloaded settings")

    def adapter():
        check(orch.load_model(SimpleNamespace(identifier=studio_adapter()), max_seq_length=0, load_in_4bit=False) is True, "load LoRA")
        on = list(orch.generate_with_adapter_control(use_adapter=True, messages=QUESTION, temperature=0.0, max_new_tokens=12))
        off = list(orch.generate_with_adapter_control(use_adapter=False, messages=QUESTION, temperature=0.0, max_new_tokens=12))
        check(on and off and on[-1] != off[-1], f"{on[-1:]} {off[-1:]}")

    def over_long():
        from core.inference.context_refusal import ContextBudgetExceeded

        check(orch.load_model(SimpleNamespace(identifier=SMOLLM2), max_seq_length=512, load_in_4bit=False) is True, "load at 512")
        try:
            texts = list(orch.generate_chat_response(QUESTION * 1 + [{"role": "user", "content": "word " * 600}], max_new_tokens=8))
        except ContextBudgetExceeded as e:
            check(e.context_tokens == 512 and e.request_tokens > 512, str(e))
        else:
            check(False, f"an over-long prompt was answered: {texts[-1:]}")

    def vision():
        from PIL import Image

        check(orch.load_model(SimpleNamespace(identifier=VISION), max_seq_length=0, load_in_4bit=False) is True, "load vision")
        holder: dict = {}
        question = [{"role": "user", "content": "What is this?"}]
        list(orch.generate_chat_response(question, image=Image.new("RGB", (64, 48), (20, 200, 30)), temperature=0.0, max_new_tokens=6, stats_holder=holder))
        with_image = holder["stats"]["usage"]["prompt_tokens"]
        list(orch.generate_chat_response(question, temperature=0.0, max_new_tokens=6, stats_holder=holder))
        check(with_image > holder["stats"]["usage"]["prompt_tokens"] + 8, f"{with_image} {holder['stats']['usage']}")

    def unload():
        check(orch.unload_model(orch.active_model_name) is True and not orch.models, "unload")

    for name, run in [
        ("SmolLM2: load_model (8-bit KV)", load), ("SmolLM2: streamed chat", chat),
        ("SmolLM2: stop mid-prefill (reset_generation_state(event))", stop),
        ("SmolLM2: count_chat_tokens", count),
        ("SmolLM2: two chats at once (resident batch), each as alone", parallel_chats),
        ("SmolLM2: n > 1 rows", batch),
        ("SmolLM2: raw completion", completion),
        ("SmolLM2: reload when settings change (the route's own comparison)", reload_on_settings),
        ("LoRA: adapter on, off", adapter),
        ("SmolLM2 at 512 tokens: over-long prompt refused", over_long),
        ("vision: an image through generate_chat_response", vision), ("unload", unload),
    ]:  # fmt: skip
        results[(name, "orchestrator")] = attempt(run)


def attempt(run) -> str:
    started = time.monotonic()
    try:
        run()
    except Exception as e:  # noqa: BLE001 - every failure is a row of the table
        detail = traceback.format_exc(limit=3) if not isinstance(e, Failed) else str(e)
        return f"FAIL ({time.monotonic() - started:.1f} s): {detail[-600:]}"
    return f"pass ({time.monotonic() - started:.1f} s)"


def main() -> int:
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    results: dict = {}
    for part in (worker_smollm2, worker_other_models, orchestrator):
        if only and only not in part.__name__:
            continue
        try:
            part(results)
        except Exception:  # noqa: BLE001
            results[(part.__name__, "setup")] = "FAIL: " + traceback.format_exc(limit=4)[-800:]
    width = max(len(name) for name, _ in results) + 2
    print(f"\n{'scenario':<{width}} {'through':<13} result")
    for (name, through), outcome in results.items():
        print(f"{name:<{width}} {through:<13} {outcome}")
    failed = [k for k, v in results.items() if not v.startswith("pass")]
    print(f"\n{len(results) - len(failed)}/{len(results)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
