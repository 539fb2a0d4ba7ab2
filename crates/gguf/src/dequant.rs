//! Dequantization of ggml block formats to `f32`.
//!
//! Every quantized format stores values in fixed-size blocks; within a block a few shared
//! parameters (scales, minimums) turn small integer codes back into floats. The layouts below
//! are ggml's (little-endian, packed, no padding).

use half::{bf16, f16};

use crate::{DequantError, GgmlType};

/// Values in a K-quant super-block.
const QK_K: usize = 256;

/// Dequantizes `n` values of type `ty` from `data`.
pub fn dequantize(ty: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>, DequantError> {
    let mut out = vec![0.0; n];
    dequantize_into(ty, data, &mut out)?;
    Ok(out)
}

/// Dequantizes `out.len()` values of type `ty` from `data` into `out`.
///
/// `data` must be exactly the bytes of those values (a whole number of blocks).
pub fn dequantize_into(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), DequantError> {
    let (Some(block_elems), Some(block_bytes)) = (ty.block_elements(), ty.block_bytes()) else {
        return Err(DequantError::Unsupported(ty));
    };
    let n = out.len();
    if !n.is_multiple_of(block_elems) {
        return Err(DequantError::PartialBlock {
            ty,
            n,
            block: block_elems,
        });
    }
    let expected = n / block_elems * block_bytes;
    if data.len() != expected {
        return Err(DequantError::WrongByteCount {
            ty,
            n,
            expected,
            got: data.len(),
        });
    }
    let block_fn: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => |b, o| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, o| o[0] = f16_at(b, 0),
        GgmlType::BF16 => |b, o| o[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        GgmlType::F64 => |b, o| o[0] = f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32,
        GgmlType::I8 => |b, o| o[0] = f32::from(b[0] as i8),
        GgmlType::I16 => |b, o| o[0] = f32::from(i16::from_le_bytes([b[0], b[1]])),
        GgmlType::I32 => |b, o| o[0] = i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
        GgmlType::Q4_0 => block_q4_0,
        GgmlType::Q4_1 => block_q4_1,
        GgmlType::Q5_0 => block_q5_0,
        GgmlType::Q5_1 => block_q5_1,
        GgmlType::Q8_0 => block_q8_0,
        GgmlType::Q8_1 => block_q8_1,
        GgmlType::Q2K => block_q2_k,
        GgmlType::Q3K => block_q3_k,
        GgmlType::Q4K => block_q4_k,
        GgmlType::Q5K => block_q5_k,
        GgmlType::Q6K => block_q6_k,
        GgmlType::Q8K => block_q8_k,
        GgmlType::Mxfp4 => block_mxfp4,
        GgmlType::I64 | GgmlType::Unknown(_) => return Err(DequantError::Unsupported(ty)),
    };
    for (block, values) in data
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(block_elems))
    {
        block_fn(block, values);
    }
    Ok(())
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Q4_0: `d: f16, qs: [u8; 16]`. Byte `j` holds value `j` in its low nibble and value `j + 16`
/// in its high nibble; a value is `(code - 8) * d`.
fn block_q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for (j, &q) in qs.iter().enumerate() {
        out[j] = (i32::from(q & 0x0f) - 8) as f32 * d;
        out[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

/// E2M1 (FP4) codes, doubled so that they are integers: sign bit, then 0, 0.5, 1, 1.5, 2, 3, 4, 6.
const E2M1_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// MXFP4: `e: u8, qs: [u8; 16]`, nibbles as in Q4_0; a value is `E2M1(code) * 2^(e - 127)`,
/// computed as the doubled code times `2^(e - 128)` (exact: both are powers of two apart).
fn block_mxfp4(b: &[u8], out: &mut [f32]) {
    let half_scale = e8m0_half(b[0]);
    for (j, &q) in b[1..17].iter().enumerate() {
        out[j] = f32::from(E2M1_DOUBLED[usize::from(q & 0x0f)]) * half_scale;
        out[j + 16] = f32::from(E2M1_DOUBLED[usize::from(q >> 4)]) * half_scale;
    }
}

/// `2^(e - 128)` by its bits (subnormal below `e = 2`), as ggml's `ggml_e8m0_to_fp32_half`.
fn e8m0_half(e: u8) -> f32 {
    let bits = match e {
        0 | 1 => 0x0020_0000u32 << e,
        _ => u32::from(e - 1) << 23,
    };
    f32::from_bits(bits)
}

/// Q4_1: `d: f16, m: f16, qs: [u8; 16]`, nibbles as in Q4_0; a value is `code * d + m`.
fn block_q4_1(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for (j, &q) in qs.iter().enumerate() {
        out[j] = f32::from(q & 0x0f) * d + m;
        out[j + 16] = f32::from(q >> 4) * d + m;
    }
}

/// Fifth bits of Q5_0/Q5_1: bit `i` of the little-endian `u32` belongs to value `i`.
fn fifth_bit(qh: u32, i: usize) -> u8 {
    (((qh >> i) & 1) as u8) << 4
}

/// Q5_0: `d: f16, qh: u32, qs: [u8; 16]`; a value is `(code - 16) * d` with a 5-bit code.
fn block_q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for (j, &q) in qs.iter().enumerate() {
        let lo = (q & 0x0f) | fifth_bit(qh, j);
        let hi = (q >> 4) | fifth_bit(qh, j + 16);
        out[j] = (i32::from(lo) - 16) as f32 * d;
        out[j + 16] = (i32::from(hi) - 16) as f32 * d;
    }
}

/// Q5_1: `d: f16, m: f16, qh: u32, qs: [u8; 16]`; a value is `code * d + m`.
fn block_q5_1(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for (j, &q) in qs.iter().enumerate() {
        out[j] = f32::from((q & 0x0f) | fifth_bit(qh, j)) * d + m;
        out[j + 16] = f32::from((q >> 4) | fifth_bit(qh, j + 16)) * d + m;
    }
}

/// Q8_0: `d: f16, qs: [i8; 32]`; a value is `code * d`.
fn block_q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

/// Q8_1: `d: f16, s: f16, qs: [i8; 32]` (`s` caches `d * sum(qs)`); a value is `code * d`.
fn block_q8_1(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[4..36]) {
        *o = f32::from(q as i8) * d;
    }
}

/// Q8_K: `d: f32, qs: [i8; 256], bsums: [i16; 16]`; a value is `code * d`.
fn block_q8_k(b: &[u8], out: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (o, &q) in out.iter_mut().zip(&b[4..4 + QK_K]) {
        *o = f32::from(q as i8) * d;
    }
}

/// Scale and minimum of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K.
///
/// Sub-blocks 0..4 keep their 6 bits in the low bits of bytes `j` (scale) and `j + 4` (min).
/// Sub-blocks 4..8 take their low 4 bits from the nibbles of byte `j + 4` and their top 2 bits
/// from the spare top bits of bytes `j - 4` (scale) and `j` (min).
fn k_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        let sc = (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc, m)
    }
}

/// Q4_K: `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]`, eight sub-blocks of 32.
///
/// Each 32-byte run of `qs` serves two sub-blocks: low nibbles the first, high nibbles the
/// second. A value is `d * scale * code - dmin * min`.
fn block_q4_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for chunk in 0..4 {
        let q = &qs[32 * chunk..32 * chunk + 32];
        let (sc_lo, m_lo) = k_scale_min(scales, 2 * chunk);
        let (sc_hi, m_hi) = k_scale_min(scales, 2 * chunk + 1);
        let (d_lo, min_lo) = (d * f32::from(sc_lo), dmin * f32::from(m_lo));
        let (d_hi, min_hi) = (d * f32::from(sc_hi), dmin * f32::from(m_hi));
        let y = &mut out[64 * chunk..64 * chunk + 64];
        for (l, &byte) in q.iter().enumerate() {
            y[l] = d_lo * f32::from(byte & 0x0f) - min_lo;
            y[l + 32] = d_hi * f32::from(byte >> 4) - min_hi;
        }
    }
}

/// Q5_K: `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]`.
///
/// Like Q4_K plus a fifth bit per value: for value `l` of sub-block `s`, bit `s` of `qh[l]`.
fn block_q5_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for chunk in 0..4 {
        let q = &qs[32 * chunk..32 * chunk + 32];
        let (sub_lo, sub_hi) = (2 * chunk, 2 * chunk + 1);
        let (sc_lo, m_lo) = k_scale_min(scales, sub_lo);
        let (sc_hi, m_hi) = k_scale_min(scales, sub_hi);
        let (d_lo, min_lo) = (d * f32::from(sc_lo), dmin * f32::from(m_lo));
        let (d_hi, min_hi) = (d * f32::from(sc_hi), dmin * f32::from(m_hi));
        let y = &mut out[64 * chunk..64 * chunk + 64];
        for l in 0..32 {
            let lo = (q[l] & 0x0f) | (((qh[l] >> sub_lo) & 1) << 4);
            let hi = (q[l] >> 4) | (((qh[l] >> sub_hi) & 1) << 4);
            y[l] = d_lo * f32::from(lo) - min_lo;
            y[l + 32] = d_hi * f32::from(hi) - min_hi;
        }
    }
}

/// Q6_K: `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`, sixteen sub-blocks of 16.
///
/// Each half of the block (128 values) uses 64 bytes of `ql`, 32 of `qh` and 8 scales. Value
/// `l + 32k` of a half (`l` in 0..32, `k` in 0..4) takes its low 4 bits from `ql[l]` (k = 0 low
/// nibble, k = 2 high nibble) or `ql[l + 32]` (k = 1 low, k = 3 high), its top 2 bits from bits
/// `2k`, `2k + 1` of `qh[l]`, and scale `l / 16 + 2k`. Codes are centred on 32: a value is
/// `d * scale * (code - 32)`.
fn block_q6_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut out[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let high = |k: usize| ((qh[l] >> (2 * k)) & 3) << 4;
            let codes = [
                (ql[l] & 0x0f) | high(0),
                (ql[l + 32] & 0x0f) | high(1),
                (ql[l] >> 4) | high(2),
                (ql[l + 32] >> 4) | high(3),
            ];
            for (k, &code) in codes.iter().enumerate() {
                let scale = f32::from(sc[is + 2 * k] as i8);
                y[l + 32 * k] = d * scale * (i32::from(code) - 32) as f32;
            }
        }
    }
}

/// Q2_K: `scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16`, sixteen sub-blocks of 16.
///
/// Each half (128 values) reads 32 bytes of `qs` four times, taking bit pairs 0-1, 2-3, 4-5,
/// 6-7 in turn. Scale byte: low nibble scales `d`, high nibble scales `dmin`; a value is
/// `d * (s & 15) * code - dmin * (s >> 4)`.
fn block_q2_k(b: &[u8], out: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for pair in 0..4 {
            for sub in 0..2 {
                let s = scales[8 * half + 2 * pair + sub];
                let dl = d * f32::from(s & 0x0f);
                let ml = dmin * f32::from(s >> 4);
                let base = 128 * half + 32 * pair + 16 * sub;
                for l in 0..16 {
                    let code = (q[16 * sub + l] >> (2 * pair)) & 3;
                    out[base + l] = dl * f32::from(code) - ml;
                }
            }
        }
    }
}

/// The sixteen 6-bit Q3_K scales (stored offset by 32) from their 12 packed bytes: low 4 bits
/// from the nibbles of bytes 0..8, top 2 bits from bit pairs of bytes 8..12.
fn q3_k_scales(packed: &[u8]) -> [i8; 16] {
    let mut scales = [0i8; 16];
    for (i, s) in scales.iter_mut().enumerate() {
        let low = if i < 8 {
            packed[i] & 0x0f
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        *s = ((low | (high << 4)) as i8) - 32;
    }
    scales
}

/// Q3_K: `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16`, sixteen sub-blocks of 16.
///
/// Low 2 bits of a code come like Q2_K's; the third bit of value `l` (0..32) of the `g`-th
/// group of 32 is bit `g` of `hmask[l]`, and a clear bit means "subtract 4". A value is
/// `d * scale * code` with the code in -4..4.
fn block_q3_k(b: &[u8], out: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for pair in 0..4 {
            let group = 4 * half + pair;
            for sub in 0..2 {
                let dl = d * f32::from(scales[8 * half + 2 * pair + sub]);
                let base = 128 * half + 32 * pair + 16 * sub;
                for l in 0..16 {
                    let idx = 16 * sub + l;
                    let low = i32::from((q[idx] >> (2 * pair)) & 3);
                    let sub4 = if hmask[idx] & (1 << group) != 0 { 0 } else { 4 };
                    out[base + l] = dl * (low - sub4) as f32;
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "dequant_tests.rs"]
mod tests;
