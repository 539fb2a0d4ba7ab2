"""The one run-time fact forced on Studio for `cargo xtask studio`: the hardware answers that make
Studio's own `detect_hardware()` choose MLX on a Linux CPU.

Python loads this file at start-up in every interpreter that has this folder on PYTHONPATH, so
also in the inference child Studio's orchestrator spawns (multiprocessing's spawn starts a
fresh interpreter with the parent's environment). It acts only where `STUDIO_MLX_CHILD=1`, which
`studio/scenarios.py` sets after it has started: the scenarios' own process (Studio's
orchestrator) keeps Studio's real answer (CPU), as it would on a Mac where it never asks.

Forced, in `utils.hardware.hardware` (Studio 2026.10.9, `_detect_hardware_locked`):
- `is_apple_silicon()` -> True: on a Mac it reads `platform.system() == "Darwin"` and
  `platform.machine() == "arm64"`; here the machine is Linux x86_64.
- `_has_usable_mlx_stack()` -> True: on a Mac it imports `mlx.core`; MLX runs in mlx-worker's
  process here, and Studio's own process never imports it on these paths.
Nothing else is changed: `detect_hardware()` itself runs and picks MLX. The package-level
`utils.hardware.is_apple_silicon` (which `core/inference/worker.py` imported for its
transformers-version switch) keeps Studio's own answer, False.
"""

import os

if os.environ.get("STUDIO_MLX_CHILD") == "1":
    import utils.hardware.hardware as _hardware

    _hardware.is_apple_silicon = lambda: True
    _hardware._has_usable_mlx_stack = lambda: True
