//! `PIL.Image.resize(size, resample)` for 8-bit RGB, bit for bit (Pillow 13.0.0,
//! `src/libImaging/Resample.c` and `Geometry.c`; written from its algorithm, not its code).
//! Why by hand: `docs/decisions/hand-written.md`. Proven by `tests/pillow_parity.rs`.
//!
//! The facts this follows:
//! - Same size: a copy. NEAREST: the affine "scale" path, not a convolution (see [`nearest`]).
//! - Otherwise a separable convolution in two passes, each skipped when its side keeps its size.
//!   Horizontal first, except when the height loses more than twice as many pixels as the width
//!   (`in_h - out_h > 0 && in_h - out_h > (in_w - out_w) * 2`): then vertical first. That rule
//!   is new in Pillow 13.0.0 (12.x always went horizontal first; a `main` of April 2026 had
//!   other rules), so results there depend on the Pillow version.
//!   The first pass writes 8-bit pixels (rounded and clipped), which the second reads: two
//!   roundings, as Pillow.
//! - Per output pixel, the filter is centred at `(i + 0.5) * scale` in input coordinates, with
//!   `scale = in / out`. When shrinking (`scale > 1`) the filter is stretched by `scale`
//!   (antialiasing): support `filter.support * max(scale, 1)`, taps `filter((x + 0.5 - center) /
//!   max(scale, 1))`, normalised to sum 1 (in f64).
//! - The weights become fixed point, `PRECISION_BITS = 32 - 8 - 2 = 22`, each rounded half away
//!   from zero; the sum starts at `1 << 21` (rounding) and the result is `sum >> 22` (arithmetic
//!   shift, i.e. floor) clamped to 0..=255.

use crate::RgbImage;

/// Pillow's resampling filters, with PIL's numbers ([`Filter::from_pil`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Filter {
    /// `Image.NEAREST` (0).
    Nearest,
    /// `Image.BOX` (4).
    Box,
    /// `Image.BILINEAR` (2): triangle, support 1.
    Bilinear,
    /// `Image.HAMMING` (5).
    Hamming,
    /// `Image.BICUBIC` (3): cubic convolution with a = -0.5, support 2.
    Bicubic,
    /// `Image.LANCZOS` (1): Lanczos-3, support 3.
    Lanczos,
}

impl Filter {
    /// The filter of a `resample` value in a processor config (`PIL.Image.Resampling`).
    pub fn from_pil(value: i64) -> Option<Self> {
        Some(match value {
            0 => Filter::Nearest,
            1 => Filter::Lanczos,
            2 => Filter::Bilinear,
            3 => Filter::Bicubic,
            4 => Filter::Box,
            5 => Filter::Hamming,
            _ => return None,
        })
    }

    /// PIL's number for this filter.
    pub fn pil_value(self) -> i64 {
        match self {
            Filter::Nearest => 0,
            Filter::Lanczos => 1,
            Filter::Bilinear => 2,
            Filter::Bicubic => 3,
            Filter::Box => 4,
            Filter::Hamming => 5,
        }
    }

    /// Half-width of the kernel at scale 1.
    fn support(self) -> f64 {
        match self {
            Filter::Nearest | Filter::Box => 0.5,
            Filter::Bilinear | Filter::Hamming => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    /// The kernel, in f64 as Pillow evaluates it.
    fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Nearest | Filter::Box => {
                if x > -0.5 && x <= 0.5 {
                    1.0
                } else {
                    0.0
                }
            }
            Filter::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Filter::Hamming => {
                let x = x.abs();
                if x == 0.0 {
                    1.0
                } else if x >= 1.0 {
                    0.0
                } else {
                    let x = x * std::f64::consts::PI;
                    // Pillow's constants are C floats (0.54f, 0.46f), widened to double.
                    x.sin() / x * (0.54f32 as f64 + 0.46f32 as f64 * x.cos())
                }
            }
            Filter::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Filter::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let x = x * std::f64::consts::PI;
        x.sin() / x
    }
}

/// Fixed-point fraction bits of the weights: 8 bits of result, 2 of headroom in an i32.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// `Image.resize((width, height), resample=filter)` of an RGB image. The colour key
/// ([`RgbImage::transparency`]) is kept, as PIL keeps `info`. Panics when `width` or `height` is
/// 0 (PIL raises); the processors never ask for that.
pub fn resize(img: &RgbImage, width: u32, height: u32, filter: Filter) -> RgbImage {
    assert!(width > 0 && height > 0, "resize to {width}x{height}");
    let mut out = if (width, height) == (img.width, img.height) {
        img.clone()
    } else if filter == Filter::Nearest {
        nearest(img, width, height)
    } else {
        convolve(img, width, height, filter)
    };
    out.transparency = img.transparency;
    out
}

/// Pillow's NEAREST: an affine transform with `a = in / out` per axis, sampled at
/// `(i + 0.5) * a` truncated; the position is accumulated (`xo += a`), not multiplied, and that
/// is what decides the index at exact halves, so it is accumulated here too.
fn nearest(img: &RgbImage, width: u32, height: u32) -> RgbImage {
    let table = |in_size: u32, out_size: u32| -> Vec<Option<usize>> {
        // Pillow: a = (double)(float box size) / out; start a * 0.5, then += a.
        let a = in_size as f32 as f64 / out_size as f64;
        let mut pos = a * 0.5;
        (0..out_size)
            .map(|_| {
                let i = if pos < 0.0 { -1 } else { pos as i64 };
                pos += a;
                (0..in_size as i64).contains(&i).then_some(i as usize)
            })
            .collect()
    };
    let xs = table(img.width, width);
    let ys = table(img.height, height);
    let mut pixels = vec![0u8; width as usize * height as usize * 3];
    for (y, sy) in ys.iter().enumerate() {
        let Some(sy) = sy else { continue };
        let row_in = &img.pixels[sy * img.width as usize * 3..];
        let row_out = &mut pixels[y * width as usize * 3..];
        for (x, sx) in xs.iter().enumerate() {
            if let Some(sx) = sx {
                row_out[x * 3..x * 3 + 3].copy_from_slice(&row_in[sx * 3..sx * 3 + 3]);
            }
        }
    }
    RgbImage::new(width, height, pixels)
}

/// One axis's taps: for each output index, the first input index and the fixed-point weights.
struct Taps {
    start: Vec<usize>,
    weights: Vec<Vec<i32>>,
}

/// Pillow's `precompute_coeffs` followed by its 8-bit normalisation (module docs).
fn taps(in_size: u32, out_size: u32, filter: Filter) -> Taps {
    // Pillow passes the box as C floats; whole sizes are exact.
    let scale = in_size as f32 as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let inv_filterscale = 1.0 / filterscale;
    let mut start = Vec::with_capacity(out_size as usize);
    let mut weights = Vec::with_capacity(out_size as usize);
    for i in 0..out_size {
        let center = (i as f64 + 0.5) * scale;
        // C's (int) cast truncates toward zero.
        let xmin = ((center - support + 0.5) as i64).max(0);
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64);
        let w: Vec<f64> = (xmin..xmax)
            .map(|x| filter.weight((x as f64 - center + 0.5) * inv_filterscale))
            .collect();
        let total: f64 = w.iter().sum();
        let fixed = w
            .iter()
            .map(|&k| {
                let k = if total != 0.0 { k / total } else { k };
                let scaled = k * (1u32 << PRECISION_BITS) as f64;
                // Round half away from zero, then truncate, as `(int)(k * (1 << 22) +- 0.5)`.
                (if k < 0.0 { scaled - 0.5 } else { scaled + 0.5 }) as i32
            })
            .collect();
        start.push(xmin as usize);
        weights.push(fixed);
    }
    Taps { start, weights }
}

/// The weighted sum back to 8 bits: floor division by 2^22 (the sum began at 2^21, so this
/// rounds), clamped.
fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

fn convolve(img: &RgbImage, width: u32, height: u32, filter: Filter) -> RgbImage {
    // Pillow 13.0.0: the vertical pass goes first when the height shrinks by more than twice
    // as many pixels as the width does (fewer rows for the horizontal pass); otherwise
    // horizontal first. Each pass is skipped when its side keeps its size.
    let shrink_h = img.height as i64 - height as i64;
    let shrink_w = img.width as i64 - width as i64;
    let vertical_first = shrink_h > 0 && shrink_h > shrink_w * 2;
    let mut cur = img.clone();
    if vertical_first {
        cur = vertical_pass(&cur, height, filter);
        horizontal_pass(&cur, width, filter)
    } else {
        cur = horizontal_pass(&cur, width, filter);
        vertical_pass(&cur, height, filter)
    }
}

fn horizontal_pass(img: &RgbImage, width: u32, filter: Filter) -> RgbImage {
    if width == img.width {
        return img.clone();
    }
    let t = taps(img.width, width, filter);
    let (w_in, w_out) = (img.width as usize, width as usize);
    let mut pixels = vec![0u8; w_out * img.height as usize * 3];
    for (row_in, row_out) in img
        .pixels
        .chunks_exact(w_in * 3)
        .zip(pixels.chunks_exact_mut(w_out * 3))
    {
        for (x, (&s, w)) in t.start.iter().zip(&t.weights).enumerate() {
            let mut sum = [1i32 << (PRECISION_BITS - 1); 3];
            for (k, &wk) in w.iter().enumerate() {
                let p = &row_in[(s + k) * 3..(s + k) * 3 + 3];
                for c in 0..3 {
                    sum[c] += p[c] as i32 * wk;
                }
            }
            for c in 0..3 {
                row_out[x * 3 + c] = clip8(sum[c]);
            }
        }
    }
    RgbImage::new(width, img.height, pixels)
}

fn vertical_pass(img: &RgbImage, height: u32, filter: Filter) -> RgbImage {
    if height == img.height {
        return img.clone();
    }
    let t = taps(img.height, height, filter);
    let stride = img.width as usize * 3;
    let mut pixels = vec![0u8; stride * height as usize];
    for (y, (&s, w)) in t.start.iter().zip(&t.weights).enumerate() {
        let row_out = &mut pixels[y * stride..(y + 1) * stride];
        for (i, out) in row_out.iter_mut().enumerate() {
            let mut sum = 1i32 << (PRECISION_BITS - 1);
            for (k, &wk) in w.iter().enumerate() {
                sum += img.pixels[(s + k) * stride + i] as i32 * wk;
            }
            *out = clip8(sum);
        }
    }
    RgbImage::new(img.width, height, pixels)
}
