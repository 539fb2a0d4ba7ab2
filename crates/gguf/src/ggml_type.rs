//! The ggml tensor element types a GGUF file can name, with their block geometry.

use std::fmt;

/// Element type of a GGUF tensor (ggml's `ggml_type`), as stored in the tensor info table.
///
/// Quantized types store a row as a run of fixed-size blocks; [`GgmlType::block_elements`] and
/// [`GgmlType::block_bytes`] give their geometry. Types this crate does not know keep their
/// numeric id in [`GgmlType::Unknown`]: the file still opens, but those tensors cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE 754 double precision.
    F64,
    /// Signed 8-bit integers.
    I8,
    /// Signed 16-bit integers.
    I16,
    /// Signed 32-bit integers.
    I32,
    /// Signed 64-bit integers.
    I64,
    /// 32 values: f16 scale, 4-bit codes centred on 8.
    Q4_0,
    /// 32 values: f16 scale and f16 minimum, 4-bit codes.
    Q4_1,
    /// 32 values: f16 scale, 5-bit codes centred on 16.
    Q5_0,
    /// 32 values: f16 scale and f16 minimum, 5-bit codes.
    Q5_1,
    /// 32 values: f16 scale, signed 8-bit codes.
    Q8_0,
    /// 32 values: f16 scale, f16 sum, signed 8-bit codes.
    Q8_1,
    /// 256-value super-block: 2-bit codes, 4-bit sub-block scales and minimums.
    Q2K,
    /// 256-value super-block: 3-bit codes, 6-bit signed sub-block scales.
    Q3K,
    /// 256-value super-block: 4-bit codes, 6-bit sub-block scales and minimums.
    Q4K,
    /// 256-value super-block: 5-bit codes, 6-bit sub-block scales and minimums.
    Q5K,
    /// 256-value super-block: 6-bit codes, 8-bit signed sub-block scales.
    Q6K,
    /// 256-value super-block: f32 scale, signed 8-bit codes, per-16 sums.
    Q8K,
    /// 32 values (OCP microscaling FP4): a power-of-two scale (E8M0), 4-bit E2M1 codes.
    Mxfp4,
    /// A type id this crate does not know (the i-quants, for instance).
    Unknown(u32),
}

impl GgmlType {
    /// Maps ggml's numeric type id to a type.
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2K,
            11 => Self::Q3K,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            15 => Self::Q8K,
            24 => Self::I8,
            25 => Self::I16,
            26 => Self::I32,
            27 => Self::I64,
            28 => Self::F64,
            30 => Self::BF16,
            39 => Self::Mxfp4,
            other => Self::Unknown(other),
        }
    }

    /// ggml's numeric type id.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q2K => 10,
            Self::Q3K => 11,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::Q8K => 15,
            Self::I8 => 24,
            Self::I16 => 25,
            Self::I32 => 26,
            Self::I64 => 27,
            Self::F64 => 28,
            Self::BF16 => 30,
            Self::Mxfp4 => 39,
            Self::Unknown(id) => id,
        }
    }

    /// Number of values one block holds (1 for plain types); `None` for unknown types.
    pub fn block_elements(self) -> Option<usize> {
        Some(match self {
            Self::F32 | Self::F16 | Self::BF16 | Self::F64 => 1,
            Self::I8 | Self::I16 | Self::I32 | Self::I64 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Q8_1 => 32,
            Self::Mxfp4 => 32,
            Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::Q6K | Self::Q8K => 256,
            Self::Unknown(_) => return None,
        })
    }

    /// Bytes one block takes; `None` for unknown types.
    pub fn block_bytes(self) -> Option<usize> {
        Some(match self {
            Self::F32 | Self::I32 => 4,
            Self::F16 | Self::BF16 | Self::I16 => 2,
            Self::F64 | Self::I64 => 8,
            Self::I8 => 1,
            Self::Q4_0 => 2 + 16,
            Self::Q4_1 => 2 + 2 + 16,
            Self::Q5_0 => 2 + 4 + 16,
            Self::Q5_1 => 2 + 2 + 4 + 16,
            Self::Q8_0 => 2 + 32,
            Self::Q8_1 => 2 + 2 + 32,
            Self::Q2K => 16 + 64 + 2 + 2,
            Self::Q3K => 32 + 64 + 12 + 2,
            Self::Q4K => 2 + 2 + 12 + 128,
            Self::Q5K => 2 + 2 + 12 + 32 + 128,
            Self::Q6K => 128 + 64 + 16 + 2,
            Self::Q8K => 4 + 256 + 2 * 16,
            Self::Mxfp4 => 1 + 16,
            Self::Unknown(_) => return None,
        })
    }

    /// Bytes taken by `n_elements` values, or `None` when the type is unknown or `n_elements`
    /// is not a whole number of blocks.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let per_block = self.block_elements()? as u64;
        if !n_elements.is_multiple_of(per_block) {
            return None;
        }
        (n_elements / per_block).checked_mul(self.block_bytes()? as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::F64 => "F64",
            Self::I8 => "I8",
            Self::I16 => "I16",
            Self::I32 => "I32",
            Self::I64 => "I64",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Q8K => "Q8_K",
            Self::Mxfp4 => "MXFP4",
            Self::Unknown(id) => return write!(f, "ggml type {id}"),
        };
        f.write_str(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for id in 0..40 {
            assert_eq!(GgmlType::from_id(id).id(), id);
        }
    }

    #[test]
    fn byte_counts_follow_block_geometry() {
        assert_eq!(GgmlType::Q4_1.bytes_for(64), Some(40));
        assert_eq!(GgmlType::Q6K.bytes_for(512), Some(420));
        assert_eq!(GgmlType::F16.bytes_for(3), Some(6));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
        assert_eq!(GgmlType::Unknown(99).bytes_for(32), None);
    }
}
