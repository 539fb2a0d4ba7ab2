"""Reference outputs for crates/images, from real Pillow, transformers and mlx-vlm.

Usage: python reference.py OUT_DIR

Writes into OUT_DIR:
- inputs/: deterministic test images (numpy seed 0) encoded as PNG/JPEG/WebP/GIF;
- decoded/NAME.rgb: what mlx-vlm's load_image gives (exif_transpose + convert("RGB")), raw RGB;
- resize/*.rgb: Image.resize(size, resample) of each decoded image, every filter, several sizes;
- models/*/: processor configs; proc/*.f32 / *.u8: the processors' outputs (little-endian);
- manifest.json: what is where, shapes, extras.
The Rust side (tests/pillow_parity.rs) recomputes everything and compares.
"""

import io
import json
import os
import sys

import numpy as np
from PIL import Image, ImageOps

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

OUT = sys.argv[1]
for sub in ("inputs", "decoded", "resize", "models", "proc"):
    os.makedirs(os.path.join(OUT, sub), exist_ok=True)

rng = np.random.RandomState(0)


def smooth(w, h):
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 255 // max(w - 1, 1)).astype(np.uint8)
    g = (y * 255 // max(h - 1, 1)).astype(np.uint8)
    b = ((x + y) * 7 % 256).astype(np.uint8)
    return np.stack([r, g, b], -1)


def noise(w, h, c=3):
    return rng.randint(0, 256, (h, w, c)).astype(np.uint8)


def mixed(w, h):
    a = smooth(w, h).astype(np.int32) + rng.randint(-40, 41, (h, w, 3))
    return np.clip(a, 0, 255).astype(np.uint8)


# name -> (bytes, exact_decode): exact_decode False where the codec is lossy and decoders
# may legitimately differ (JPEG, lossy WebP).
inputs = {}


def save(name, im, fmt, exact=True, **kw):
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    inputs[name] = (buf.getvalue(), exact)


def png_raw(name, w, h, color_type, bit_depth, raw_rows, extra=b""):
    """A PNG written by hand (16-bit, tRNS), so the file is exactly what we mean."""
    import struct
    import zlib

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0)
    data = b"".join(b"\x00" + r for r in raw_rows)
    inputs[name] = (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra + chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b""),
        True,
    )


save("gradient_64x48.png", Image.fromarray(smooth(64, 48)), "PNG")
save("noise_37x23.png", Image.fromarray(noise(37, 23)), "PNG")
save("one_1x1.png", Image.fromarray(noise(1, 1)), "PNG")
save("tall_3x1000.png", Image.fromarray(noise(3, 1000)), "PNG")
save("wide_1000x3.png", Image.fromarray(mixed(1000, 3)), "PNG")
save("banner_120x30.png", Image.fromarray(mixed(120, 30)), "PNG")
save("portrait_29x100.png", Image.fromarray(mixed(29, 100)), "PNG")
save("photo_799x601.png", Image.fromarray(mixed(799, 601)), "PNG")
save("rgba_50x40.png", Image.fromarray(noise(50, 40, 4), "RGBA"), "PNG")
save("gray_45x33.png", Image.fromarray(noise(45, 33, 1)[:, :, 0], "L"), "PNG")
save("la_20x20.png", Image.fromarray(noise(20, 20, 2), "LA"), "PNG")
pal = Image.fromarray(mixed(40, 30)).quantize(colors=37)
save("palette_40x30.png", pal, "PNG")
save("palette_trns_40x30.png", pal, "PNG", transparency=5)
alpha_table = bytes([255] * 10 + [128, 0] + [255] * 25)
save("palette_alpha_40x30.png", pal, "PNG", transparency=alpha_table)
rgb_key = mixed(24, 18)
rgb_key[::3, ::2] = [10, 20, 30]
save("rgb_trns_24x18.png", Image.fromarray(rgb_key), "PNG", transparency=(10, 20, 30))
gray_rows = [
    b"".join(int(v).to_bytes(2, "big") for v in row)
    for row in rng.randint(0, 65536, (20, 30)).tolist()
]
gray_rows[0] = b"".join(int(v).to_bytes(2, "big") for v in [0, 1, 100, 254, 255, 256, 1000] * 4 + [65535, 300])
png_raw("gray16_30x20.png", 30, 20, 0, 16, gray_rows)
png_raw("rgb16_21x13.png", 21, 13, 2, 16, [rng.randint(0, 256, 21 * 6).astype(np.uint8).tobytes() for _ in range(13)])
png_raw("rgba16_9x7.png", 9, 7, 6, 16, [rng.randint(0, 256, 9 * 8).astype(np.uint8).tobytes() for _ in range(7)])
png_raw("gray2_16x5.png", 16, 5, 0, 2, [rng.randint(0, 256, 4).astype(np.uint8).tobytes() for _ in range(5)])
png_raw("gray1_16x4.png", 16, 4, 0, 1, [rng.randint(0, 256, 2).astype(np.uint8).tobytes() for _ in range(4)])
photo = Image.fromarray(mixed(799, 601))
save("photo_799x601_q90.jpg", photo, "JPEG", exact=False, quality=90)
save("photo_799x601_444.jpg", photo, "JPEG", exact=False, quality=95, subsampling=0)
save("gray_45x33.jpg", Image.fromarray(noise(45, 33, 1)[:, :, 0], "L"), "JPEG", exact=False, quality=90)
exif = Image.Exif()
exif[0x0112] = 6  # rotate 90 degrees clockwise to display
save("exif6_64x48.jpg", Image.fromarray(smooth(64, 48)), "JPEG", exact=False, quality=95, exif=exif.tobytes())
exif8 = Image.Exif()
exif8[0x0112] = 8  # rotate 90 degrees counter-clockwise to display
save("exif8_40x30.png", Image.fromarray(mixed(40, 30)), "PNG", exif=exif8.tobytes())
save("cmyk_40x30.jpg", Image.fromarray(mixed(40, 30)).convert("CMYK"), "JPEG", exact=False, quality=95)
save("lossless_80x60.webp", Image.fromarray(mixed(80, 60)), "WEBP", lossless=True)
save("rgba_lossless_50x40.webp", Image.fromarray(noise(50, 40, 4), "RGBA"), "WEBP", lossless=True)
# Lossy WebP: libwebp (Pillow) and image-webp decode VP8 and convert YUV to RGB identically.
save("lossy_80x60.webp", Image.fromarray(mixed(80, 60)), "WEBP", quality=80)
save("lossy_799x601.webp", photo, "WEBP", quality=75)
save("lossy_alpha_50x40.webp", Image.fromarray(noise(50, 40, 4), "RGBA"), "WEBP", quality=60)
save("palette_40x30.gif", pal, "GIF")
save("palette_trns_40x30.gif", pal, "GIF", transparency=5)


def gif_on_larger_screen(name, im, screen, offset, **kw):
    """A GIF whose first frame is smaller than the logical screen and placed at an offset:
    Pillow's writer makes both the same size, so the two descriptors are patched."""
    buf = io.BytesIO()
    im.save(buf, "GIF", **kw)
    b = bytearray(buf.getvalue())
    b[6:10] = screen[0].to_bytes(2, "little") + screen[1].to_bytes(2, "little")
    i = b.index(b",", 13 + 3 * (2 ** ((b[10] & 7) + 1)))  # image descriptor after the colour table
    b[i + 1:i + 5] = offset[0].to_bytes(2, "little") + offset[1].to_bytes(2, "little")
    inputs[name] = (bytes(b), True)


gif_on_larger_screen("offset_frame_40x30.gif", Image.fromarray(noise(20, 10)).quantize(colors=8), (40, 30), (5, 7))
gif_on_larger_screen("offset_frame_trns_40x30.gif", Image.fromarray(noise(20, 10)).quantize(colors=8), (40, 30), (12, 3), transparency=2)
frames = [Image.fromarray(noise(33, 21)).quantize(colors=16) for _ in range(2)]
buf = io.BytesIO()
frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=50)
inputs["anim_33x21.gif"] = (buf.getvalue(), True)

FILTERS = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


def sizes(w, h):
    up = (w * 2 + 1, h * 2 + 3) if w * h < 100_000 else (w * 5 // 4, h * 5 // 4 + 1)
    out = [(max(1, w // 3), max(1, h // 3)), up, (w * 3 // 2 + 1, max(1, h // 2)), (17, 9), (1, 1)]
    out += [(max(1, w - 1), h), (w, h + 1)]
    return sorted(set(out))


manifest = {"images": [], "resize": [], "processors": []}
decoded = {}
for name, (data, exact) in sorted(inputs.items()):
    path = os.path.join(OUT, "inputs", name)
    with open(path, "wb") as f:
        f.write(data)
    # mlx_vlm.utils.load_image, without its URL branch.
    im = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
    decoded[name] = im
    key = im.info.get("transparency")
    with open(os.path.join(OUT, "decoded", name + ".rgb"), "wb") as f:
        f.write(np.asarray(im, dtype=np.uint8).tobytes())
    manifest["images"].append(
        {
            "name": name,
            "width": im.width,
            "height": im.height,
            "transparency": list(key) if isinstance(key, tuple) else None,
            "exact_decode": exact,
        }
    )
    w, h = im.size
    for fname, fval in FILTERS.items():
        for sw, sh in sizes(w, h):
            out = f"{name}.{fname}.{sw}x{sh}.rgb"
            r = im.resize((sw, sh), resample=fval)
            with open(os.path.join(OUT, "resize", out), "wb") as f:
                f.write(np.asarray(r, dtype=np.uint8).tobytes())
            manifest["resize"].append({"image": name, "filter": fval, "width": sw, "height": sh, "out": out})


def model_dir(name, preprocessor=None, processor=None):
    d = os.path.join(OUT, "models", name)
    os.makedirs(d, exist_ok=True)
    if preprocessor is not None:
        with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
            json.dump(preprocessor, f)
    if processor is not None:
        with open(os.path.join(d, "processor_config.json"), "w") as f:
            json.dump(processor, f)
    return d


def write(name, arr, dtype):
    with open(os.path.join(OUT, "proc", name), "wb") as f:
        f.write(np.ascontiguousarray(arr, dtype=dtype).tobytes())


from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil
from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLImageProcessor, _qwen_vl_image_kwargs
from mlx_vlm.models.pixtral.image_processing_pixtral import PixtralImageProcessor, _size_to_pair

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
# Configs as real checkpoints ship them (google/gemma-3-4b-it, Qwen/Qwen2.5-VL-7B-Instruct,
# HuggingFaceTB/SmolVLM-256M-Instruct, llava-hf/llava-1.5-7b-hf, a SigLIP llava), plus small ones.
MODELS = {
    "gemma3_896": ("gemma3", Gemma3ImageProcessorPil, {
        "image_processor_type": "Gemma3ImageProcessor", "do_convert_rgb": None, "do_normalize": True,
        "do_pan_and_scan": None, "do_rescale": True, "do_resize": True, "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3, "resample": 2, "rescale_factor": 0.00392156862745098,
        "size": {"height": 896, "width": 896}}, None),
    "gemma3_nested_64": ("gemma3", Gemma3ImageProcessorPil, {"size": {"height": 500, "width": 500}},
                         {"image_processor": {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 64, "width": 48}}}),
    "gemma3_pan_and_scan": ("gemma3", Gemma3ImageProcessorPil, {
        "image_processor_type": "Gemma3ImageProcessor", "do_pan_and_scan": True,
        "pan_and_scan_min_crop_size": 8, "pan_and_scan_max_num_crops": 3,
        "pan_and_scan_min_ratio_to_activate": 1.2, "size": {"height": 24, "width": 24}}, None),
    "clip_llava": ("llava", CLIPImageProcessorPil, {
        "image_processor_type": "CLIPImageProcessor", "crop_size": {"height": 336, "width": 336},
        "do_center_crop": True, "do_convert_rgb": True, "do_normalize": True, "do_rescale": True,
        "do_resize": True, "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "resample": 3,
        "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}}, None),
    "clip_pad": ("llava", CLIPImageProcessorPil, {
        "image_processor_type": "CLIPImageProcessor", "crop_size": 40, "size": 30}, None),
    "siglip_384": ("llava", SiglipImageProcessorPil, {
        "image_processor_type": "SiglipImageProcessor", "do_normalize": True, "do_rescale": True,
        "do_resize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 3,
        "rescale_factor": 0.00392156862745098, "size": {"height": 384, "width": 384}}, None),
    "idefics3_default": ("idefics3", Idefics3ImageProcessorPil, {"image_processor_type": "Idefics3ImageProcessor"}, None),
    "smolvlm_256m": ("smolvlm", SmolVLMImageProcessorPil, {
        "image_processor_type": "SmolVLMImageProcessor", "do_convert_rgb": True, "do_image_splitting": True,
        "do_normalize": True, "do_pad": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "max_image_size": {"longest_edge": 512},
        "resample": 1, "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 2048}}, None),
    "smolvlm_small": ("smolvlm", SmolVLMImageProcessorPil, {
        "image_processor_type": "SmolVLMImageProcessor", "max_image_size": {"longest_edge": 96},
        "size": {"longest_edge": 250}}, None),
    "smolvlm_nosplit": ("smolvlm", SmolVLMImageProcessorPil, {
        "image_processor_type": "SmolVLMImageProcessor", "do_image_splitting": False,
        "max_image_size": {"longest_edge": 64}, "size": {"longest_edge": 200}}, None),
    "qwen2_5_vl": ("qwen2_5_vl", None, {
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "image_processor_type": "Qwen2VLImageProcessor",
        "max_pixels": 12845056, "merge_size": 2, "min_pixels": 3136, "patch_size": 14,
        "resample": 3, "rescale_factor": 0.00392156862745098, "temporal_patch_size": 2}, None),
    "qwen3_vl_small": ("qwen3_vl", None, {
        "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "merge_size": 2, "temporal_patch_size": 2,
        "size": {"longest_edge": 64 * 64 * 3, "shortest_edge": 32 * 32 * 4}}, None),
    "qwen2_vl_defaults": ("qwen2_vl", None, None, None),
    # mistralai/Mistral-Small-3.1-24B-Instruct-2503's files; a small one with a merge of 2.
    "pixtral_mistral_small": ("mistral3", None, {
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": CLIP_MEAN, "image_processor_type": "PixtralImageProcessor", "image_std": CLIP_STD,
        "patch_size": {"height": 14, "width": 14}, "processor_class": "PixtralProcessor", "resample": 3,
        "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 1540}}, {
        "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]", "image_token": "[IMG]",
        "patch_size": 14, "processor_class": "PixtralProcessor", "spatial_merge_size": 2}),
    "pixtral_small": ("mistral3", None, {"size": {"longest_edge": 64}, "patch_size": 8},
                      {"spatial_merge_size": 2}),
}
# The patch Mistral3Processor passes its image processor: patch_size * spatial_merge_size.
PIXTRAL_PATCH = {"pixtral_mistral_small": 28, "pixtral_small": 16}

# Which images each model sees: every image one at a time where it is cheap, a few big ones.
small = [n for n in decoded if decoded[n].width * decoded[n].height <= 5000]
big = ["photo_799x601.png", "tall_3x1000.png", "wide_1000x3.png", "photo_799x601_q90.jpg", "exif6_64x48.jpg"]
# Models with big outputs (real checkpoints' sizes: 896 px, 2048 px in 512 px tiles) see a few
# images, the small configurations all of them, so that the test stays within ~100 MB of disk.
FEW = {"gemma3_896", "clip_llava", "siglip_384", "idefics3_default", "smolvlm_256m", "pixtral_mistral_small"}
few = ["photo_799x601.png", "rgb_trns_24x18.png", "tall_3x1000.png", "palette_trns_40x30.gif"]
for mname, (model_type, cls, pre, proc) in MODELS.items():
    d = model_dir(mname, pre, proc)
    if mname in ("idefics3_default", "smolvlm_256m"):
        sets = [["photo_799x601.png"], ["tall_3x1000.png"]]
    elif mname in FEW:
        sets = [[n] for n in few]
    else:
        sets = [[n] for n in small + big] + [["gradient_64x48.png", "photo_799x601.png"]]
    for images in sets:
        if model_type.startswith("qwen") and any(
            max(decoded[n].size) / min(decoded[n].size) > 200 for n in images
        ):
            continue  # refused by smart_resize (checked in Rust unit tests)
        # mlx-vlm's load_image result, fresh per call (info and all).
        pil = [ImageOps.exif_transpose(Image.open(os.path.join(OUT, "inputs", n))).convert("RGB") for n in images]
        if model_type.startswith("qwen"):
            default_patch = 16 if model_type == "qwen3_vl" else 14
            p = Qwen3VLImageProcessor(**_qwen_vl_image_kwargs(d, default_patch_size=default_patch))
            out = p(pil)
        elif model_type == "mistral3":
            p = PixtralImageProcessor.from_pretrained(d)
            edge = _size_to_pair(p.size)[0]
            if any(min(i.size) * edge // max(i.size) == 0 for i in pil if max(i.size) > edge):
                continue  # a side fits to 0 pixels: refused (checked in Rust unit tests)
            out = p(pil, patch_size=PIXTRAL_PATCH[mname])
        else:
            p = cls.from_pretrained(d)
            kwargs = {"return_row_col_info": True} if model_type in ("idefics3", "smolvlm") else {}
            out = p(pil, return_tensors="np", **kwargs)
        tag = f"{mname}.{'+'.join(images)}"
        pv = np.asarray(out["pixel_values"])
        entry = {
            "model": mname,
            "model_type": model_type,
            "images": images,
            "pixel_values": "proc/" + tag + ".f32",
            "shape": list(pv.shape),
            "dtype": str(pv.dtype),
        }
        write(tag + ".f32", pv, "<f4")
        if "image_grid_thw" in out:
            entry["image_grid_thw"] = np.asarray(out["image_grid_thw"]).tolist()
        if "num_crops" in out:
            entry["num_crops"] = np.asarray(out["num_crops"]).reshape(-1).tolist()
        if "pixel_attention_mask" in out:
            m = np.asarray(out["pixel_attention_mask"])
            write(tag + ".mask", m, "u1")
            entry["mask"] = "proc/" + tag + ".mask"
            entry["mask_shape"] = list(m.shape)
        if "image_sizes" in out:
            entry["image_sizes"] = [list(map(int, s)) for s in out["image_sizes"]]
        if "rows" in out:
            entry["rows"] = np.asarray(out["rows"]).reshape(-1).tolist()
            entry["cols"] = np.asarray(out["cols"]).reshape(-1).tolist()
        manifest["processors"].append(entry)
    manifest.setdefault("models", {})[mname] = {"dir": d, "model_type": model_type}

with open(os.path.join(OUT, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
print(f"{len(manifest['images'])} images, {len(manifest['resize'])} resizes, {len(manifest['processors'])} processor runs")
