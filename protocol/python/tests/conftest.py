"""The real worker and the real models, from the environment `cargo xtask test` sets:
``MLX_WORKER_BIN`` (the binary), ``MLX_WORKER_SMOLLM2_DIR``, ``MLX_WORKER_GEMMA3_DIR`` and
``MLX_WORKER_TINY_LORA_DIR`` (a tiny Llama with a LoRA adapter in ``adapter/``, written by
``cargo xtask parity``'s fixtures), ``MLX_WORKER_VISION_FIXTURES`` (its vision models and images). A missing one fails the test, never skips it."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlx_worker import Client


def _required_dir(env: str, default: Path | None = None) -> str:
    value = os.environ.get(env)
    path = Path(value) if value else default
    if path is None or not path.is_dir():
        pytest.fail(f"{env} must name a model directory (run `cargo xtask setup`), got {path}")
    return str(path)


@pytest.fixture(scope="session")
def binary() -> str:
    path = os.environ.get("MLX_WORKER_BIN", "")
    if not os.access(path, os.X_OK):
        pytest.fail(f"MLX_WORKER_BIN must name the mlx-worker binary, got {path!r}")
    return path


@pytest.fixture(scope="session")
def smollm2() -> str:
    return _required_dir("MLX_WORKER_SMOLLM2_DIR", Path.home() / ".cache/mlx-worker/models/SmolLM2-135M-Instruct")


@pytest.fixture(scope="session")
def gemma3() -> str:
    return _required_dir("MLX_WORKER_GEMMA3_DIR", Path.home() / ".cache/mlx-worker/models/gemma-3-270m")


@pytest.fixture(scope="session")
def tiny_vision() -> SimpleNamespace:
    """The tiny Gemma 3 vision model of ``cargo xtask parity`` and its case images."""
    root = Path(_required_dir("MLX_WORKER_VISION_FIXTURES"))
    return SimpleNamespace(model=_required_dir("", root / "tiny-gemma3-vl"), images=root / "images")


@pytest.fixture(scope="session")
def tiny_lora() -> SimpleNamespace:
    base = Path(_required_dir("MLX_WORKER_TINY_LORA_DIR"))
    adapter = base / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        pytest.fail(f"no LoRA adapter in {adapter}")
    return SimpleNamespace(base=str(base), adapter=str(adapter))


@pytest.fixture()
def client(binary: str):
    with Client(binary) as c:
        yield c


#: The load settings every test uses with SmolLM2: float weights (4-bit matmuls are slow on a
#: CPU), a context that fits the long prompts.
FAST = {"load_in_4bit": False, "max_seq_length": 4096}

HELLO = [{"role": "user", "content": "Name three colours."}]


def greedy_text(client: Client, messages, max_new_tokens: int, **params) -> str:
    """The worker's own greedy answer, over the raw protocol."""
    result = client.generate(messages, temperature=0.0, max_new_tokens=max_new_tokens, **params).finish()
    return result["text"]
