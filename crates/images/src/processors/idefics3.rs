//! `Idefics3ImageProcessor` / `SmolVLMImageProcessor` (the same algorithm) of transformers' PIL
//! backend, which mlx-vlm loads with `use_fast=False`:
//! 1. resize so the longest edge is `size.longest_edge` (up or down; the other side
//!    `int(...)`-truncated, then made even), capped at 4096;
//! 2. with splitting: resize up to multiples of `max_image_size.longest_edge` (the tile), cut
//!    into tiles row by row, and append the whole image squashed to one tile (the global
//!    image); an image of at most one tile stays one tile (rows = cols = 0);
//!    without splitting: squash to one tile;
//! 3. rescale, normalize; pad to the largest tile (all tiles are tile x tile, so no padding in
//!    practice) with `pixel_attention_mask` ones over real pixels.
//!
//! Every resize is LANCZOS on 8-bit pixels (PIL), so Lanczos runs twice on each image (step 1,
//! then step 2) and a third time for the global image.

use serde_json::{Map, Value};

use super::hf::{crop, Fields, Rescale, Size};
use super::{PixelValues, ProcessedImages};
use crate::error::{ImageError, Result};
use crate::resize::{resize, Filter};
use crate::RgbImage;

/// transformers' `MAX_IMAGE_SIZE`: no side beyond 4096 after step 1.
pub const MAX_IMAGE_SIZE: u32 = 4096;

/// An Idefics3 / SmolVLM image processor.
#[derive(Debug, Clone, PartialEq)]
pub struct Idefics3ImageProcessor {
    pub do_resize: bool,
    /// `size.longest_edge` (Idefics3 4 x 364, SmolVLM checkpoints set theirs).
    pub longest_edge: u32,
    pub resample: Filter,
    pub do_image_splitting: bool,
    /// `max_image_size.longest_edge`: the tile side.
    pub tile: u32,
    pub do_pad: bool,
    pub rescale: Rescale,
    /// transformers' `do_convert_rgb`: composite a colour-keyed image onto white
    /// ([`RgbImage::hf_convert_to_rgb`]). Off for `null` (Gemma 3's checkpoints).
    pub do_convert_rgb: bool,
}

/// One image's tiles, 8-bit, before rescale.
#[derive(Debug, Clone)]
pub struct Tiles {
    /// Row-major tiles, then the global image (or just the image when not split).
    pub images: Vec<RgbImage>,
    pub rows: usize,
    pub cols: usize,
}

impl Idefics3ImageProcessor {
    /// From the settings of [`super::hf::hf_config`].
    pub fn from_config(config: &Map<String, Value>) -> Result<Self> {
        let f = Fields(config);
        let longest = |key: &str, default: u32| -> Result<u32> {
            match f.size(key, Size::LongestEdge(default), false)? {
                Size::LongestEdge(n) => Ok(n),
                other => Err(ImageError::Unsupported {
                    field: key.into(),
                    reason: format!("expected {{\"longest_edge\": n}}, found {other:?}"),
                }),
            }
        };
        Ok(Self {
            do_resize: f.bool("do_resize", true)?,
            longest_edge: longest("size", 4 * 364)?,
            resample: f.filter("resample", Filter::Lanczos)?,
            do_image_splitting: f.bool("do_image_splitting", true)?,
            tile: longest("max_image_size", 364)?,
            do_pad: f.bool("do_pad", true)?,
            do_convert_rgb: f.bool("do_convert_rgb", true)?,
            rescale: Rescale {
                do_rescale: f.bool("do_rescale", true)?,
                factor: f.f64("rescale_factor", 1.0 / 255.0)?,
                do_normalize: f.bool("do_normalize", true)?,
                mean: f.triple("image_mean", [0.5; 3])?,
                std: f.triple("image_std", [0.5; 3])?,
            },
        })
    }

    /// Steps 1 and 2 for one image.
    pub fn tiles(&self, img: &RgbImage) -> Tiles {
        let mut img = if self.do_convert_rgb {
            img.hf_convert_to_rgb()
        } else {
            img.clone()
        };
        if self.do_resize {
            let (h, w) = longest_edge_size(img.height, img.width, self.longest_edge);
            img = resize(&img, w, h, self.resample);
        }
        let t = self.tile;
        if !self.do_image_splitting {
            return Tiles {
                images: vec![resize(&img, t, t, self.resample)],
                rows: 0,
                cols: 0,
            };
        }
        let (h, w) = tile_multiple_size(img.height, img.width, t);
        img = resize(&img, w, h, self.resample);
        let (rows, cols) = split_grid(img.height, img.width, t);
        if rows == 0 {
            return Tiles {
                images: vec![img],
                rows: 0,
                cols: 0,
            };
        }
        let mut images = Vec::with_capacity(rows * cols + 1);
        for r in 0..rows {
            for c in 0..cols {
                images.push(crop(&img, c as u32 * t, r as u32 * t, t, t));
            }
        }
        images.push(resize(&img, t, t, self.resample));
        Tiles { images, rows, cols }
    }

    /// The tile rows and columns of an image of `height` x `width` pixels (before any resize),
    /// as [`Self::tiles`] cuts it: `(0, 0)` for an image kept whole. Needs no pixels, so the
    /// prompt can be expanded before preprocessing.
    pub fn grid(&self, height: u32, width: u32) -> (usize, usize) {
        let (mut h, mut w) = (height, width);
        if self.do_resize {
            (h, w) = longest_edge_size(h, w, self.longest_edge);
        }
        if !self.do_image_splitting {
            return (0, 0);
        }
        let (h, w) = tile_multiple_size(h, w, self.tile);
        split_grid(h, w, self.tile)
    }

    /// All images of one prompt (one batch entry, as mlx-vlm passes them): `pixel_values`
    /// `[1, n_tiles, 3, H, W]`, `pixel_attention_mask` `[1, n_tiles, H, W]`, rows and cols per
    /// image.
    pub fn preprocess(&self, images: &[RgbImage]) -> Result<ProcessedImages> {
        let tiles: Vec<Tiles> = images.iter().map(|i| self.tiles(i)).collect();
        let all: Vec<&RgbImage> = tiles.iter().flat_map(|t| &t.images).collect();
        let max_h = all.iter().map(|i| i.height).max().unwrap_or(0) as usize;
        let max_w = all.iter().map(|i| i.width).max().unwrap_or(0) as usize;
        if !self.do_pad
            && all
                .iter()
                .any(|i| (i.height as usize, i.width as usize) != (max_h, max_w))
        {
            return Err(ImageError::Unsupported {
                field: "do_pad".into(),
                reason: "false with tiles of different sizes (transformers returns a ragged list)"
                    .into(),
            });
        }
        let mut data = Vec::with_capacity(all.len() * 3 * max_h * max_w);
        let mut mask = Vec::with_capacity(all.len() * max_h * max_w);
        for img in &all {
            let (h, w) = (img.height as usize, img.width as usize);
            for c in 0..3 {
                for y in 0..max_h {
                    for x in 0..max_w {
                        data.push(if y < h && x < w {
                            self.rescale.hf_value(img.pixels[(y * w + x) * 3 + c], c)
                        } else {
                            0.0
                        });
                    }
                }
            }
            for y in 0..max_h {
                for x in 0..max_w {
                    mask.push(u8::from(y < h && x < w));
                }
            }
        }
        let n = all.len();
        Ok(ProcessedImages {
            pixel_values: PixelValues {
                data,
                shape: vec![1, n, 3, max_h, max_w],
            },
            pixel_attention_mask: self.do_pad.then(|| super::Mask {
                data: mask,
                shape: vec![1, n, max_h, max_w],
            }),
            rows: tiles.iter().map(|t| t.rows).collect(),
            cols: tiles.iter().map(|t| t.cols).collect(),
            ..ProcessedImages::default()
        })
    }
}

/// Tile rows and columns of an image already resized to tile multiples: `(size - tile) //
/// tile + 1` per axis, `(0, 0)` when it fits in one tile.
fn split_grid(height: u32, width: u32, tile: u32) -> (usize, usize) {
    match height <= tile && width <= tile {
        true => (0, 0),
        false => (
            ((height - tile) / tile + 1) as usize,
            ((width - tile) / tile + 1) as usize,
        ),
    }
}

/// Step 1: `_resize_output_size_rescale_to_max_len` then `_scale_below_upper_bound(4096)`.
/// Returns `(height, width)`.
pub fn longest_edge_size(height: u32, width: u32, max_len: u32) -> (u32, u32) {
    let (mut h, mut w) = (height as i64, width as i64);
    let aspect = w as f64 / h as f64;
    if w >= h {
        w = max_len as i64;
        h = (w as f64 / aspect) as i64;
        if h % 2 != 0 {
            h += 1;
        }
    } else {
        h = max_len as i64;
        w = (h as f64 * aspect) as i64;
        if w % 2 != 0 {
            w += 1;
        }
    }
    let (h, w) = (h.max(1), w.max(1));
    // Below the upper bound.
    let aspect = w as f64 / h as f64;
    let max = MAX_IMAGE_SIZE as i64;
    let (h, w) = if w >= h && w > max {
        ((max as f64 / aspect) as i64, max)
    } else if h > w && h > max {
        (max, (max as f64 * aspect) as i64)
    } else {
        (h, w)
    };
    (h.max(1) as u32, w.max(1) as u32)
}

/// Step 2's size: `resize_for_vision_encoder`. The long side goes up to a tile multiple, the
/// other side follows the aspect ratio (truncated) and goes up to a tile multiple too.
pub fn tile_multiple_size(height: u32, width: u32, tile: u32) -> (u32, u32) {
    let (h, w, t) = (height as f64, width as f64, tile as f64);
    let aspect = w / h;
    if width >= height {
        let w = (w / t).ceil() * t;
        let h = ((w / aspect) as i64) as f64;
        let h = (h / t).ceil() * t;
        (h as u32, w as u32)
    } else {
        let h = (h / t).ceil() * t;
        let w = ((h * aspect) as i64) as f64;
        let w = (w / t).ceil() * t;
        (h as u32, w as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_from_the_size_is_the_tiling() {
        let config = serde_json::json!({
            "size": {"longest_edge": 160}, "max_image_size": {"longest_edge": 80}
        });
        let mut p = Idefics3ImageProcessor::from_config(config.as_object().unwrap()).unwrap();
        for (w, h) in [
            (400, 300),
            (100, 300),
            (60, 40),
            (161, 20),
            (80, 80),
            (1000, 999),
        ] {
            let img = RgbImage {
                width: w,
                height: h,
                pixels: vec![7; (w * h * 3) as usize],
                transparency: None,
            };
            for split in [true, false] {
                p.do_image_splitting = split;
                let tiles = p.tiles(&img);
                assert_eq!(
                    p.grid(h, w),
                    (tiles.rows, tiles.cols),
                    "{w}x{h} split {split}"
                );
            }
        }
    }
}
