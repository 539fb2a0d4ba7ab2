//! Whole random blocks of every quantized format, checked against gguf-py's independent
//! decoder (`data/dequant_reference.bin`, made by `data/make_dequant_reference.py`).

use gguf::dequant::dequantize;
use gguf::GgmlType;

const REFERENCE: &[u8] = include_bytes!("data/dequant_reference.bin");

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}

#[test]
fn matches_gguf_py_on_random_blocks() {
    let mut seen = Vec::new();
    let mut at = 0;
    while at < REFERENCE.len() {
        let ty = GgmlType::from_id(u32_at(REFERENCE, at) as u32);
        let blocks = u32_at(REFERENCE, at + 4);
        let n_bytes = u32_at(REFERENCE, at + 8);
        at += 12;
        let data = &REFERENCE[at..at + n_bytes];
        at += n_bytes;
        let n = blocks * ty.block_elements().unwrap();
        let expected: Vec<f32> = REFERENCE[at..at + 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        at += 4 * n;

        let got = dequantize(ty, data, n).unwrap();
        let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            // Both sides compute in f32 but may multiply in another order: allow rounding.
            assert!(
                (g - e).abs() <= 1e-6 * scale,
                "{ty} value {i}: got {g}, gguf-py {e}"
            );
        }
        seen.push(ty);
    }
    use GgmlType::*;
    assert_eq!(
        seen,
        [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, BF16, Mxfp4]
    );
}
