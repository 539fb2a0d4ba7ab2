"""What needs no model: image conversion, Studio's stats, the worker's exit with its host."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time

from mlx_worker.studio import generation_stats, image_to_wire


def test_images_become_what_the_worker_takes(tmp_path):
    png = b"\x89PNG\r\n\x1a\nfake"
    assert base64.b64decode(image_to_wire(png)) == png
    path = tmp_path / "cat.png"
    path.write_bytes(png)
    assert image_to_wire(path) == str(path)
    assert image_to_wire(str(path)) == str(path)
    assert image_to_wire("data:image/png;base64,AAAA") == "data:image/png;base64,AAAA"
    assert image_to_wire(None) is None

    class PilLike:  # what the backend uses of a PIL image: save(buffer, format=...)
        def save(self, buffer, format):
            assert format == "PNG"
            buffer.write(png)

    assert base64.b64decode(image_to_wire(PilLike())) == png


def test_stats_have_studios_names():
    result = {
        "text": "ab", "finish_reason": "length",
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14, "cached_tokens": 6},
        "timings": {"prompt_n": 4, "prompt_ms": 8.0, "prompt_per_second": 500.0, "predicted_n": 4,
                    "predicted_ms": 20.0, "predicted_per_second": 200.0, "ttft_ms": 9.0},
    }  # fmt: skip
    stats = generation_stats(result)
    assert stats["usage"] == {
        "prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
        "prompt_tokens_details": {"cached_tokens": 6},
    }  # fmt: skip
    assert stats["finish_reason"] == "length"
    timings = stats["timings"]
    assert (timings["prompt_per_token_ms"], timings["predicted_per_token_ms"], timings["cache_n"]) == (2.0, 5.0, 6)
    assert "draft_n" not in timings
    # Drafts ran: their counts; a cancelled reply is a stop, in Studio's words.
    result["usage"].update(drafted_tokens=5, accepted_tokens=3)
    result["finish_reason"] = "cancelled"
    stats = generation_stats(result)
    assert (stats["timings"]["draft_n"], stats["timings"]["draft_n_accepted"]) == (5, 3)
    assert stats["finish_reason"] == "stop"


def test_no_worker_outlives_its_host(binary: str):
    # A host that starts a worker and exits without closing it.
    host = subprocess.run(
        [sys.executable, "-c", "import mlx_worker, sys; c = mlx_worker.Client(sys.argv[1]); print(c.pid)", binary],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    pid = int(host.stdout)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.05)
    assert not _running(pid), "the worker outlived its host"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) is not running.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
