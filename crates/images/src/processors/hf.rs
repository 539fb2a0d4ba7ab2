//! What Hugging Face transformers' PIL backend (`PilBackend`, transformers 5.24) does for every
//! processor: config loading, `size` dicts, resize targets, center crop, rescale, normalize.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{ImageError, Result};
use crate::resize::Filter;
use crate::RgbImage;

/// The image processor's settings as `from_pretrained` finds them in a model directory:
/// `processor_config.json`'s `image_processor` object when there is one (transformers 5 prefers
/// it), else `preprocessor_config.json`. Empty when neither exists (the class defaults apply).
pub fn hf_config(dir: &Path) -> Result<Map<String, Value>> {
    if let Some(Value::Object(proc)) = read_json(&dir.join("processor_config.json"))? {
        if let Some(Value::Object(ip)) = proc.get("image_processor") {
            return Ok(ip.clone());
        }
    }
    match read_json(&dir.join("preprocessor_config.json"))? {
        Some(Value::Object(map)) => Ok(map),
        Some(_) => Err(ImageError::Config {
            path: dir.join("preprocessor_config.json"),
            reason: "not a JSON object".into(),
        }),
        None => Ok(Map::new()),
    }
}

/// A JSON file, `None` when it does not exist.
pub fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| ImageError::Config {
                path: path.to_owned(),
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ImageError::Config {
            path: path.to_owned(),
            reason: e.to_string(),
        }),
    }
}

/// A `size` (or `crop_size`) after transformers' `get_size_dict`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// `{"height", "width"}`: exactly that.
    HeightWidth { height: u32, width: u32 },
    /// `{"shortest_edge"}`: the short side becomes this, aspect ratio kept (truncated).
    ShortestEdge(u32),
    /// `{"shortest_edge", "longest_edge"}` (DETR style; also Qwen's pixel budget).
    ShortestLongest { shortest: u32, longest: u32 },
    /// `{"longest_edge"}` (Idefics3).
    LongestEdge(u32),
}

impl Size {
    /// Parses a config value: a dict, an int (square when `default_to_square`, else the
    /// shortest edge) or a `[height, width]` list.
    pub fn parse(field: &str, value: &Value, default_to_square: bool) -> Result<Self> {
        let bad = |reason: &str| ImageError::Unsupported {
            field: field.into(),
            reason: format!("{reason}: {value}"),
        };
        let int = |v: &Value| {
            v.as_u64()
                .filter(|&n| n > 0 && n <= u32::MAX as u64)
                .map(|n| n as u32)
        };
        match value {
            Value::Number(_) => {
                let n = int(value).ok_or_else(|| bad("not a positive integer"))?;
                Ok(if default_to_square {
                    Size::HeightWidth {
                        height: n,
                        width: n,
                    }
                } else {
                    Size::ShortestEdge(n)
                })
            }
            Value::Array(items) if items.len() == 2 => Ok(Size::HeightWidth {
                height: int(&items[0]).ok_or_else(|| bad("bad height"))?,
                width: int(&items[1]).ok_or_else(|| bad("bad width"))?,
            }),
            Value::Object(map) => {
                let get = |k: &str| map.get(k).filter(|v| !v.is_null());
                let num = |k: &str| -> Result<Option<u32>> {
                    get(k)
                        .map(|v| {
                            int(v).ok_or_else(|| bad(&format!("{k} is not a positive integer")))
                        })
                        .transpose()
                };
                match (
                    num("height")?,
                    num("width")?,
                    num("shortest_edge")?,
                    num("longest_edge")?,
                ) {
                    (Some(height), Some(width), None, None) => {
                        Ok(Size::HeightWidth { height, width })
                    }
                    (None, None, Some(s), None) => Ok(Size::ShortestEdge(s)),
                    (None, None, Some(shortest), Some(longest)) => {
                        Ok(Size::ShortestLongest { shortest, longest })
                    }
                    (None, None, None, Some(l)) => Ok(Size::LongestEdge(l)),
                    _ => Err(bad("unsupported combination of keys")),
                }
            }
            _ => Err(bad("not a size")),
        }
    }

    /// `PilBackend.resize`'s target `(height, width)` for an image of `(height, width)`.
    pub fn target(self, height: u32, width: u32) -> Result<(u32, u32)> {
        match self {
            Size::HeightWidth { height, width } => Ok((height, width)),
            // get_resize_output_image_size(default_to_square=False): the long side is
            // int(size * long / short).
            Size::ShortestEdge(size) => {
                let (short, long) = if width <= height {
                    (width, height)
                } else {
                    (height, width)
                };
                let new_long = ((size as u64 * long as u64) as f64 / short as f64) as u32;
                Ok(if width <= height {
                    (new_long, size)
                } else {
                    (size, new_long)
                })
            }
            Size::ShortestLongest { shortest, longest } => Ok(size_with_aspect_ratio(
                height,
                width,
                shortest,
                Some(longest),
            )),
            Size::LongestEdge(_) => Err(ImageError::Unsupported {
                field: "size".into(),
                reason: "longest_edge alone is only for Idefics3/SmolVLM".into(),
            }),
        }
    }
}

/// transformers' `get_size_with_aspect_ratio`.
fn size_with_aspect_ratio(height: u32, width: u32, size: u32, max_size: Option<u32>) -> (u32, u32) {
    let mut size = size as f64;
    let mut raw_size = None;
    if let Some(max) = max_size {
        let min_orig = height.min(width) as f64;
        let max_orig = height.max(width) as f64;
        if max_orig / min_orig * size > max as f64 {
            let raw = max as f64 * min_orig / max_orig;
            raw_size = Some(raw);
            size = raw.round_ties_even();
        }
    }
    let size_i = size as u32;
    if (height <= width && height == size_i) || (width <= height && width == size_i) {
        (height, width)
    } else if width < height {
        let oh = match raw_size {
            Some(raw) => (raw * height as f64 / width as f64) as u32,
            None => (size_i as f64 * height as f64 / width as f64) as u32,
        };
        (oh, size_i)
    } else {
        let ow = match raw_size {
            Some(raw) => (raw * width as f64 / height as f64) as u32,
            None => (size_i as f64 * width as f64 / height as f64) as u32,
        };
        (size_i, ow)
    }
}

/// transformers' `center_crop` of an 8-bit image: the centred window, zero-padded (as transformers
/// pads) where the image is smaller than the crop.
pub fn center_crop(img: &RgbImage, crop_h: u32, crop_w: u32) -> RgbImage {
    let (h, w) = (img.height as i64, img.width as i64);
    let (ch, cw) = (crop_h as i64, crop_w as i64);
    // Python's // floors.
    let top = (h - ch).div_euclid(2);
    let left = (w - cw).div_euclid(2);
    if top >= 0 && top + ch <= h && left >= 0 && left + cw <= w {
        let mut pixels = Vec::with_capacity((ch * cw * 3) as usize);
        for y in top..top + ch {
            let row = (y * w * 3) as usize;
            pixels.extend_from_slice(
                &img.pixels[row + (left * 3) as usize..row + ((left + cw) * 3) as usize],
            );
        }
        return RgbImage::new(crop_w, crop_h, pixels);
    }
    // Pad to max(crop, image) with the image at ceil((new - orig) / 2), then crop as above,
    // shifted by the padding and clipped to the padded image.
    let (nh, nw) = (ch.max(h), cw.max(w));
    let top_pad = (nh - h + 1) / 2;
    let left_pad = (nw - w + 1) / 2;
    let (top, left) = (top + top_pad, left + left_pad);
    let (y0, y1) = (top.max(0), (top + ch).min(nh));
    let (x0, x1) = (left.max(0), (left + cw).min(nw));
    let mut pixels = Vec::with_capacity(((y1 - y0) * (x1 - x0) * 3) as usize);
    for y in y0..y1 {
        for x in x0..x1 {
            let (sy, sx) = (y - top_pad, x - left_pad);
            if (0..h).contains(&sy) && (0..w).contains(&sx) {
                let i = ((sy * w + sx) * 3) as usize;
                pixels.extend_from_slice(&img.pixels[i..i + 3]);
            } else {
                pixels.extend_from_slice(&[0, 0, 0]);
            }
        }
    }
    RgbImage::new((x1 - x0) as u32, (y1 - y0) as u32, pixels)
}

/// A NumPy slice `image[:, y0:y0+h, x0:x0+w]`: clipped at the image's edges.
pub fn crop(img: &RgbImage, x0: u32, y0: u32, w: u32, h: u32) -> RgbImage {
    let x1 = (x0 + w).min(img.width);
    let y1 = (y0 + h).min(img.height);
    let (x0, y0) = (x0.min(x1), y0.min(y1));
    let mut pixels = Vec::with_capacity(((x1 - x0) * (y1 - y0) * 3) as usize);
    for y in y0..y1 {
        let row = (y * img.width * 3) as usize;
        pixels.extend_from_slice(&img.pixels[row + (x0 * 3) as usize..row + (x1 * 3) as usize]);
    }
    RgbImage::new(x1 - x0, y1 - y0, pixels)
}

/// How 8-bit values become floats.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rescale {
    pub do_rescale: bool,
    pub factor: f64,
    pub do_normalize: bool,
    pub mean: [f64; 3],
    pub std: [f64; 3],
}

impl Rescale {
    /// transformers: `rescale` multiplies in f64 and casts to f32 (`(v as f64 * factor) as
    /// f32`); `normalize` subtracts and divides in f32 with mean and std cast to f32.
    pub fn hf_value(&self, v: u8, channel: usize) -> f32 {
        let x = if self.do_rescale {
            (v as f64 * self.factor) as f32
        } else {
            v as f32
        };
        self.normalize(x, channel)
    }

    /// mlx-vlm's NumPy port (Qwen-VL): `img.astype(float32) * factor` multiplies in f32 (NumPy 2
    /// casts the Python float to the array's f32), then the same f32 normalize.
    pub fn f32_value(&self, v: u8, channel: usize) -> f32 {
        let x = if self.do_rescale {
            v as f32 * self.factor as f32
        } else {
            v as f32
        };
        self.normalize(x, channel)
    }

    fn normalize(&self, x: f32, c: usize) -> f32 {
        if self.do_normalize {
            (x - self.mean[c] as f32) / self.std[c] as f32
        } else {
            x
        }
    }

    /// An RGB image as CHW floats, appended to `out`, with transformers' arithmetic.
    pub fn hf_chw(&self, img: &RgbImage, out: &mut Vec<f32>) {
        for c in 0..3 {
            out.extend(img.pixels.chunks_exact(3).map(|px| self.hf_value(px[c], c)));
        }
    }
}

/// Typed readers for config fields. An absent field takes the class default. A `null` is
/// Python's `None`, which transformers keeps (its `__init__` sets every key as given): a `null`
/// flag is false (Gemma 3 checkpoints ship `"do_convert_rgb": null`, which turns the conversion
/// off), a `null` filter is BILINEAR (`PilBackend.resize`'s fallback), and any other `null` is
/// refused, since transformers would fail on it.
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl Fields<'_> {
    /// The value, `None` when absent; an error when `null`.
    fn get(&self, key: &str) -> Result<Option<&Value>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::Null) => Err(ImageError::Unsupported {
                field: key.into(),
                reason: "null is not supported here; remove the field or give a value".into(),
            }),
            Some(v) => Ok(Some(v)),
        }
    }

    /// Whether the key is present with `null`.
    pub fn is_null(&self, key: &str) -> bool {
        matches!(self.0.get(key), Some(Value::Null))
    }

    fn bad(&self, key: &str, what: &str) -> ImageError {
        ImageError::Unsupported {
            field: key.into(),
            reason: format!("expected {what}, found {}", self.0[key]),
        }
    }

    pub fn bool(&self, key: &str, default: bool) -> Result<bool> {
        match self.0.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(false),
            Some(v) => v.as_bool().ok_or_else(|| self.bad(key, "true or false")),
        }
    }

    pub fn f64(&self, key: &str, default: f64) -> Result<f64> {
        self.get(key)?.map_or(Ok(default), |v| {
            v.as_f64().ok_or_else(|| self.bad(key, "a number"))
        })
    }

    pub fn u32(&self, key: &str, default: u32) -> Result<u32> {
        self.get(key)?.map_or(Ok(default), |v| {
            v.as_u64()
                .filter(|&n| n > 0 && n <= u32::MAX as u64)
                .map(|n| n as u32)
                .ok_or_else(|| self.bad(key, "a positive integer"))
        })
    }

    pub fn u64(&self, key: &str, default: u64) -> Result<u64> {
        self.get(key)?.map_or(Ok(default), |v| {
            v.as_u64().ok_or_else(|| self.bad(key, "an integer"))
        })
    }

    /// `image_mean` / `image_std`: three numbers, or one for all channels.
    pub fn triple(&self, key: &str, default: [f64; 3]) -> Result<[f64; 3]> {
        match self.get(key)? {
            None => Ok(default),
            Some(Value::Number(n)) => {
                let x = n.as_f64().ok_or_else(|| self.bad(key, "a number"))?;
                Ok([x; 3])
            }
            Some(Value::Array(a)) if a.len() == 3 => {
                let mut out = [0.0; 3];
                for (o, v) in out.iter_mut().zip(a) {
                    *o = v.as_f64().ok_or_else(|| self.bad(key, "three numbers"))?;
                }
                Ok(out)
            }
            Some(_) => Err(self.bad(key, "three numbers")),
        }
    }

    pub fn filter(&self, key: &str, default: Filter) -> Result<Filter> {
        if self.is_null(key) {
            return Ok(Filter::Bilinear);
        }
        match self.get(key)? {
            None => Ok(default),
            Some(v) => v
                .as_i64()
                .and_then(Filter::from_pil)
                .ok_or_else(|| self.bad(key, "a PIL resampling filter number (0-5)")),
        }
    }

    pub fn size(&self, key: &str, default: Size, default_to_square: bool) -> Result<Size> {
        self.get(key)?
            .map_or(Ok(default), |v| Size::parse(key, v, default_to_square))
    }
}
