"""mlx-lm's model types, for `cargo xtask families`.

Prints JSON: [{"model_type", "module"}] for every module of `mlx_lm.models` that defines a
`Model` class (its file name is the model_type mlx-lm loads it for), then every alias of
`mlx_lm.utils.MODEL_REMAPPING` (a model_type mlx-lm runs with another's module).
"""

import json
import re
from pathlib import Path

import mlx_lm.models
from mlx_lm.utils import MODEL_REMAPPING

root = Path(mlx_lm.models.__file__).parent
types = [
    {"model_type": f.stem, "module": f.stem}
    for f in sorted(root.glob("*.py"))
    if re.search(r"^class Model\(", f.read_text(), re.M)
]
types += [
    {"model_type": alias, "module": module} for alias, module in sorted(MODEL_REMAPPING.items())
]
print(json.dumps(types))
