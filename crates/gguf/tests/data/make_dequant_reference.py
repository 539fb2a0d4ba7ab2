"""Writes dequant_reference.bin: random ggml blocks and their values as decoded by gguf-py.

gguf-py (the `gguf` package on PyPI, llama.cpp's Python library) has its own NumPy decoder for
each block format, written apart from ours, so agreement on random blocks is evidence both
read the layouts the same way. Regenerate with:

    python -m venv /tmp/gguf-ref && /tmp/gguf-ref/bin/pip install gguf==0.19.0 numpy
    /tmp/gguf-ref/bin/python make_dequant_reference.py

File format (little-endian), repeated to the end:
    u32 ggml type id, u32 block count, u32 byte count, the blocks, f32 values
"""

import struct

import gguf
import numpy as np
from gguf.quants import dequantize

Q = gguf.GGMLQuantizationType
# Byte offsets of the f16 scale fields in each block: random bytes there would often be
# NaN or infinity, so they get ordinary random scales instead.
F16_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
    Q.BF16: [],
    # E8M0 scale byte: any value is a finite power of two.
    Q.MXFP4: [],
}
BLOCKS = 4

rng = np.random.default_rng(20240607)
out = bytearray()
for qtype, fields in F16_FIELDS.items():
    elems, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(BLOCKS, size), dtype=np.uint8)
    for at in fields:
        scales = rng.normal(0, 0.05, size=BLOCKS).astype(np.float16)
        blocks[:, at:at + 2] = scales.view(np.uint8).reshape(BLOCKS, 2)
    if qtype == Q.BF16:
        # Keep bf16 finite: clear the top exponent bit of every high byte.
        blocks[:, 1::2] &= 0xBF
    values = dequantize(blocks.reshape(-1), qtype).astype(np.float32).reshape(-1)
    assert values.size == BLOCKS * elems and np.isfinite(values).all()
    raw = blocks.tobytes()
    out += struct.pack("<III", int(qtype), BLOCKS, len(raw)) + raw + values.astype("<f4").tobytes()

with open("dequant_reference.bin", "wb") as f:
    f.write(out)
print(f"wrote {len(out)} bytes")
