//! Each format is checked on a hand-built block: a few codes and scales are set by hand and
//! the expected values are worked out from the format description, not by the code under test.
//! `tests/kquant_reference.rs` adds whole random blocks checked against an independent decoder.

use super::*;

const F16_ONE: [u8; 2] = [0x00, 0x3c];
const F16_HALF: [u8; 2] = [0x00, 0x38];
const F16_QUARTER: [u8; 2] = [0x00, 0x34];
const F16_TWO: [u8; 2] = [0x00, 0x40];
const F16_MINUS_ONE: [u8; 2] = [0x00, 0xbc];

fn run(ty: GgmlType, block: &[u8]) -> Vec<f32> {
    let n = ty.block_elements().unwrap();
    dequantize(ty, block, n).unwrap()
}

#[test]
fn plain_types() {
    let f32s: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(dequantize(GgmlType::F32, &f32s, 2).unwrap(), [1.5, -2.0]);
    let f16s = [F16_HALF, F16_MINUS_ONE].concat();
    assert_eq!(dequantize(GgmlType::F16, &f16s, 2).unwrap(), [0.5, -1.0]);
    // bf16 is the top half of an f32: 0x3fc0 -> 0x3fc00000 = 1.5.
    assert_eq!(dequantize(GgmlType::BF16, &[0xc0, 0x3f], 1).unwrap(), [1.5]);
    assert_eq!(dequantize(GgmlType::I8, &[0xfe], 1).unwrap(), [-2.0]);
}

#[test]
fn q4_0() {
    let mut b = [0x88u8; 18];
    b[..2].copy_from_slice(&F16_HALF);
    b[2] = 0x9f; // value 0: code 15, value 16: code 9
    let y = run(GgmlType::Q4_0, &b);
    assert_eq!(y[0], (15.0 - 8.0) * 0.5);
    assert_eq!(y[16], (9.0 - 8.0) * 0.5);
    assert!(y
        .iter()
        .enumerate()
        .all(|(i, &v)| i == 0 || i == 16 || v == 0.0));
}

#[test]
fn q4_1() {
    let mut b = [0u8; 20];
    b[..2].copy_from_slice(&F16_QUARTER);
    b[2..4].copy_from_slice(&F16_MINUS_ONE);
    b[4 + 3] = 0x4c; // value 3: code 12, value 19: code 4
    let y = run(GgmlType::Q4_1, &b);
    assert_eq!(y[3], 12.0 * 0.25 - 1.0);
    assert_eq!(y[19], 4.0 * 0.25 - 1.0);
    assert_eq!(y[0], -1.0);
}

#[test]
fn q5_0() {
    let mut b = [0u8; 22];
    b[..2].copy_from_slice(&F16_ONE);
    b[2..6].copy_from_slice(&((1u32 << 0) | (1 << 17)).to_le_bytes());
    b[6] = 0x21; // value 0: low 1 + fifth bit; value 16: low 2, no fifth bit
    let y = run(GgmlType::Q5_0, &b);
    assert_eq!(y[0], (17.0 - 16.0) * 1.0);
    assert_eq!(y[16], 2.0 - 16.0);
    assert_eq!(y[1], -16.0);
    assert_eq!(y[17], 16.0 - 16.0); // only the fifth bit (bit 17)
}

#[test]
fn q5_1() {
    let mut b = [0u8; 24];
    b[..2].copy_from_slice(&F16_TWO);
    b[2..4].copy_from_slice(&F16_HALF);
    b[4..8].copy_from_slice(&(1u32 << 31).to_le_bytes());
    b[8 + 15] = 0xf3; // value 15: code 3; value 31: code 15 + 16
    let y = run(GgmlType::Q5_1, &b);
    assert_eq!(y[15], 3.0 * 2.0 + 0.5);
    assert_eq!(y[31], 31.0 * 2.0 + 0.5);
    assert_eq!(y[0], 0.5);
}

#[test]
fn q8_0_and_q8_1() {
    let mut b = [0u8; 34];
    b[..2].copy_from_slice(&F16_HALF);
    b[2] = (-3i8) as u8;
    b[33] = 127;
    let y = run(GgmlType::Q8_0, &b);
    assert_eq!((y[0], y[31], y[1]), (-1.5, 63.5, 0.0));

    let mut b = [0u8; 36];
    b[..2].copy_from_slice(&F16_HALF);
    b[2..4].copy_from_slice(&F16_TWO); // the cached sum plays no part in the values
    b[4] = (-3i8) as u8;
    let y = run(GgmlType::Q8_1, &b);
    assert_eq!((y[0], y[1]), (-1.5, 0.0));
}

#[test]
fn q8_k() {
    let mut b = vec![0u8; 292];
    b[..4].copy_from_slice(&0.25f32.to_le_bytes());
    b[4 + 255] = 0x80; // -128
    let y = run(GgmlType::Q8K, &b);
    assert_eq!((y[255], y[0]), (-32.0, 0.0));
}

/// Scales shared by the Q4_K and Q5_K tests: sub-block 0 has scale 3 and min 2 (plain 6-bit
/// bytes 0 and 4); sub-block 5 has scale 37 = 0b10_0101 and min 20 = 0b01_0100, split into
/// low nibbles in byte 9 and top bit pairs in bytes 1 and 5.
fn k_scales() -> [u8; 12] {
    let mut s = [0u8; 12];
    s[0] = 3;
    s[4] = 2;
    s[9] = 0x45; // scale low nibble 5, min low nibble 4
    s[1] = 0b10 << 6; // scale top bits of sub-block 5
    s[5] = 0b01 << 6; // min top bits of sub-block 5
    s
}

#[test]
fn q4_k() {
    let mut b = vec![0u8; 144];
    b[..2].copy_from_slice(&F16_ONE);
    b[2..4].copy_from_slice(&F16_HALF);
    b[4..16].copy_from_slice(&k_scales());
    let qs = 16;
    b[qs] = 0x06; // value 0 (sub-block 0, low nibble): code 6
    b[qs + 64 + 7] = 0xa0; // value 167 (sub-block 5 = chunk 2, high nibble, l = 7): code 10
    let y = run(GgmlType::Q4K, &b);
    assert_eq!(y[0], 1.0 * 3.0 * 6.0 - 0.5 * 2.0);
    assert_eq!(y[167], 1.0 * 37.0 * 10.0 - 0.5 * 20.0);
    assert_eq!(y[160], -0.5 * 20.0);
    assert_eq!(y[32], 0.0); // sub-block 1: scale and min are the low 6 bits of bytes 1 and 5
}

#[test]
fn q5_k() {
    let mut b = vec![0u8; 176];
    b[..2].copy_from_slice(&F16_ONE);
    b[2..4].copy_from_slice(&F16_HALF);
    b[4..16].copy_from_slice(&k_scales());
    let (qh, qs) = (16, 48);
    b[qs] = 0x06;
    b[qh] = 1; // fifth bit of value 0 (sub-block 0)
    b[qs + 64 + 7] = 0xa0;
    b[qh + 7] = 1 << 5; // fifth bit of value 167 (sub-block 5)
    let y = run(GgmlType::Q5K, &b);
    assert_eq!(y[0], 3.0 * 22.0 - 1.0);
    assert_eq!(y[167], 37.0 * 26.0 - 10.0);
    assert_eq!(y[168], -10.0);
}

#[test]
fn q6_k() {
    let mut b = vec![0u8; 210];
    b[208..210].copy_from_slice(&F16_HALF);
    b[192] = 2; // scale of values 0..16
    b[192 + 14] = (-4i8) as u8; // second half, l < 16, k = 3
                                // Value 229 = 128 + 96 + 5: second half, k = 3, l = 5 -> high nibble of ql[64 + 32 + 5],
                                // bits 6..8 of qh[32 + 5].
    b[64 + 32 + 5] = 0x70;
    b[128 + 32 + 5] = 0b10 << 6;
    let y = run(GgmlType::Q6K, &b);
    assert_eq!(y[229], 0.5 * -4.0 * ((7 | (2 << 4)) - 32) as f32);
    assert_eq!(y[0], 0.5 * 2.0 * -32.0);
    assert_eq!(y[16], 0.0); // scale 1 is zero
}

#[test]
fn q2_k() {
    let mut b = vec![0u8; 84];
    b[80..82].copy_from_slice(&F16_ONE);
    b[82..84].copy_from_slice(&F16_HALF);
    // Value 211 = 128 + 32*2 + 16 + 3: second half, bit pair 2, second sub-block, l = 3.
    b[8 + 2 * 2 + 1] = 0x35; // scale 5, min 3
    b[16 + 32 + 16 + 3] = 0b10 << 4; // code 2 in bits 4..6
    let y = run(GgmlType::Q2K, &b);
    assert_eq!(y[211], 5.0 * 2.0 - 0.5 * 3.0);
    assert_eq!(y[210], -0.5 * 3.0);
    assert_eq!(y[147], 0.0); // same byte, bit pair 0, scale byte 9 is zero
}

#[test]
fn q3_k() {
    let mut b = vec![0u8; 110];
    b[108..110].copy_from_slice(&F16_HALF);
    // Scale 13 = 37 - 32 = 5: low nibble in the high half of byte 5, top pair in bits 6..8 of
    // byte 9. Scale 13 serves value 128 + 64 + 16 + l.
    b[96 + 5] = 0x50;
    b[96 + 9] = 0b10 << 6;
    b[32 + 32 + 19] = 0b11 << 4; // value 211: low bits 3 (bit pair 2)
    b[19] = 1 << 6; // value 211: third bit set (group 6), nothing subtracted
    let y = run(GgmlType::Q3K, &b);
    assert_eq!(y[211], 0.5 * 5.0 * 3.0);
    assert_eq!(y[212], 0.5 * 5.0 * -4.0); // code 0, third bit clear: 0 - 4
                                          // Scale 0 has no bits set: 0 - 32.
    assert_eq!(y[0], 0.5 * -32.0 * -4.0);
}

#[test]
fn size_errors_are_reported() {
    assert_eq!(
        dequantize(GgmlType::Q8_0, &[0; 34], 16),
        Err(DequantError::PartialBlock {
            ty: GgmlType::Q8_0,
            n: 16,
            block: 32
        })
    );
    assert!(matches!(
        dequantize(GgmlType::Q4_0, &[0; 17], 32),
        Err(DequantError::WrongByteCount { .. })
    ));
    assert!(matches!(
        dequantize(GgmlType::Unknown(20), &[], 0),
        Err(DequantError::Unsupported(_))
    ));
}
