//! Parsing of the GGUF container: header, metadata, tensor table, and access to tensor bytes.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use memmap2::Mmap;

use crate::dequant;
use crate::{GgmlType, GgufError, MetadataValue};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml tensors have at most four dimensions; a few more are tolerated, nonsense is not.
const MAX_DIMS: u32 = 8;

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name as llama.cpp writes it, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions as GGUF stores them: fastest-varying first (`dims[0]` is the row length).
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Byte offset of the data from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Row-major shape (slowest first), the order safetensors, NumPy and MLX use:
    /// a GGUF `[576, 49152]` tensor has shape `[49152, 576]`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Number of values.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes the data takes, or `None` for a type of unknown geometry.
    pub fn byte_len(&self) -> Option<u64> {
        self.ggml_type.bytes_for(self.n_elements())
    }
}

/// The bytes of a GGUF file: memory-mapped from disk, or owned (files built in memory).
enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// An opened GGUF file: parsed metadata and tensor table over the file's bytes.
///
/// Tensor data is not copied: [`GgufFile::tensor_data`] borrows it from the mapping.
pub struct GgufFile {
    bytes: Bytes,
    version: u32,
    alignment: u64,
    metadata: Vec<(String, MetadataValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only; like every mmap reader we rely on nobody
        // truncating the model file while it is open.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(Bytes::Mapped(map))
    }

    /// Parses a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Bytes::Owned(bytes))
    }

    fn parse(bytes: Bytes) -> Result<Self, GgufError> {
        let mut cur = Cursor {
            buf: &bytes,
            pos: 0,
            depth: 0,
        };
        let magic = cur.take(4, || "the magic".into())?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic {
                found: [magic[0], magic[1], magic[2], magic[3]],
            });
        }
        let version = cur.u32(|| "the version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let tensor_count = cur.u64(|| "the tensor count".into())?;
        let kv_count = cur.u64(|| "the metadata count".into())?;

        let mut metadata = Vec::new();
        let mut metadata_index = HashMap::new();
        for i in 0..kv_count {
            let key = cur.string(|| format!("metadata key #{i}"))?;
            let type_id = cur.u32(|| format!("the type of metadata key {key:?}"))?;
            let value = cur.value(type_id, &key)?;
            metadata_index.insert(key.clone(), metadata.len());
            metadata.push((key, value));
        }

        let alignment = match metadata_index.get(ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => match metadata[i].1.as_u64() {
                Some(a) if a > 0 => a,
                _ => {
                    return Err(GgufError::WrongType {
                        key: ALIGNMENT_KEY.into(),
                        expected: "a positive integer",
                        found: metadata[i].1.type_name(),
                    })
                }
            },
        };

        let mut tensors = Vec::new();
        let mut tensor_index = HashMap::new();
        for i in 0..tensor_count {
            let name = cur.string(|| format!("tensor name #{i}"))?;
            let n_dims = cur.u32(|| format!("the rank of tensor {name:?}"))?;
            if n_dims > MAX_DIMS {
                return Err(GgufError::BadTensor {
                    name,
                    reason: format!("{n_dims} dimensions (at most {MAX_DIMS} are possible)"),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(cur.u64(|| format!("the dimensions of tensor {name:?}"))?);
            }
            let ggml_type = GgmlType::from_id(cur.u32(|| format!("the type of tensor {name:?}"))?);
            let offset = cur.u64(|| format!("the offset of tensor {name:?}"))?;
            if dims
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d))
                .is_none()
            {
                return Err(GgufError::BadTensor {
                    name,
                    reason: format!("dimensions {dims:?} hold more than 2^64 values"),
                });
            }
            if tensor_index.contains_key(&name) {
                return Err(GgufError::BadTensor {
                    name,
                    reason: "the name is used twice".into(),
                });
            }
            tensor_index.insert(name.clone(), tensors.len());
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }

        let data_offset = (cur.pos as u64).next_multiple_of(alignment);
        let file_len = bytes.len() as u64;
        for t in &tensors {
            if t.offset % alignment != 0 {
                return Err(GgufError::BadTensor {
                    name: t.name.clone(),
                    reason: format!(
                        "offset {} is not a multiple of the alignment {alignment}",
                        t.offset
                    ),
                });
            }
            if let Some(len) = t.byte_len() {
                let end = data_offset
                    .checked_add(t.offset)
                    .and_then(|start| start.checked_add(len));
                if end.is_none_or(|end| end > file_len) {
                    return Err(GgufError::Truncated {
                        what: format!("the data of tensor {:?}", t.name),
                        offset: data_offset.saturating_add(t.offset),
                        needed: len,
                        len: file_len,
                    });
                }
            }
        }

        Ok(Self {
            bytes,
            version,
            alignment,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
            data_offset,
        })
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data (`general.alignment`, 32 when absent).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, MetadataValue)] {
        &self.metadata
    }

    /// The value of one metadata key.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A metadata value converted to `T`: `Ok(None)` when the key is absent, an error when it
    /// holds a value of another type.
    pub fn get_as<T: FromMetadata>(&self, key: &str) -> Result<Option<T>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => T::from_metadata(v)
                .map(Some)
                .ok_or_else(|| GgufError::WrongType {
                    key: key.into(),
                    expected: T::EXPECTED,
                    found: v.type_name(),
                }),
        }
    }

    /// Like [`GgufFile::get_as`], but a missing key is an error.
    pub fn require<T: FromMetadata>(&self, key: &str) -> Result<T, GgufError> {
        self.get_as(key)?
            .ok_or_else(|| GgufError::MissingKey(key.into()))
    }

    /// `general.architecture`, e.g. `llama`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        let v = self
            .get("general.architecture")
            .ok_or_else(|| GgufError::MissingKey("general.architecture".into()))?;
        v.as_str().ok_or_else(|| GgufError::WrongType {
            key: "general.architecture".into(),
            expected: "string",
            found: v.type_name(),
        })
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (quantized blocks as stored).
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8], GgufError> {
        let len = info.byte_len().ok_or_else(|| GgufError::BadTensor {
            name: info.name.clone(),
            reason: format!(
                "element type {} has an unknown block size, or {} values are not whole blocks",
                info.ggml_type,
                info.n_elements()
            ),
        })?;
        // Bounds were checked at parse time for every tensor of this file.
        let start = (self.data_offset + info.offset) as usize;
        Ok(&self.bytes[start..start + len as usize])
    }

    /// Dequantizes the tensor called `name` to `f32`, row-major (see [`TensorInfo::shape`]).
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let info = self
            .tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.into()))?;
        // The data first: a tensor of unknown geometry fails before anything is allocated.
        self.tensor_data(info)?;
        let mut out = vec![0.0; info.n_elements() as usize];
        self.dequantize_into(info, &mut out)?;
        Ok(out)
    }

    /// Dequantizes a tensor into `out`, which must hold exactly its number of values.
    pub fn dequantize_into(&self, info: &TensorInfo, out: &mut [f32]) -> Result<(), GgufError> {
        let data = self.tensor_data(info)?;
        dequant::dequantize_into(info.ggml_type, data, out).map_err(|source| GgufError::Dequant {
            name: info.name.clone(),
            source,
        })
    }
}

/// Conversion of a [`MetadataValue`] into a Rust type, for [`GgufFile::get_as`].
pub trait FromMetadata: Sized {
    /// What the conversion accepts, for error messages.
    const EXPECTED: &'static str;
    /// Converts, or `None` when the value has another type.
    fn from_metadata(value: &MetadataValue) -> Option<Self>;
}

impl FromMetadata for u64 {
    const EXPECTED: &'static str = "a non-negative integer";
    fn from_metadata(value: &MetadataValue) -> Option<Self> {
        value.as_u64()
    }
}

impl FromMetadata for usize {
    const EXPECTED: &'static str = "a non-negative integer";
    fn from_metadata(value: &MetadataValue) -> Option<Self> {
        value.as_u64().and_then(|v| usize::try_from(v).ok())
    }
}

impl FromMetadata for u32 {
    const EXPECTED: &'static str = "a non-negative 32-bit integer";
    fn from_metadata(value: &MetadataValue) -> Option<Self> {
        value.as_u64().and_then(|v| u32::try_from(v).ok())
    }
}

impl FromMetadata for i64 {
    const EXPECTED: &'static str = "an integer";
    fn from_metadata(value: &MetadataValue) -> Option<Self> {
        value.as_i64()
    }
}

impl FromMetadata for f64 {
    const EXPECTED: &'static str = "a number";
    fn from_metadata(value: &MetadataValue) -> Option<Self> {
        value.as_f64()
    }
}

impl FromMetadata for bool {
    const EXPECTED: &'static str = "a bool";
    fn from_metadata(value: &MetadataValue) -> Option<Self> {
        value.as_bool()
    }
}

impl FromMetadata for String {
    const EXPECTED: &'static str = "a string";
    fn from_metadata(value: &MetadataValue) -> Option<Self> {
        value.as_str().map(str::to_owned)
    }
}

impl<T: FromMetadata> FromMetadata for Vec<T> {
    const EXPECTED: &'static str = "an array";
    fn from_metadata(value: &MetadataValue) -> Option<Self> {
        value.as_array()?.iter().map(T::from_metadata).collect()
    }
}

/// Bounds-checked little-endian reader over the header.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// How many arrays the value being read is inside.
    depth: u32,
}

/// The deepest nesting of metadata arrays read.
const MAX_ARRAY_DEPTH: u32 = 8;

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if n > remaining {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                len: self.buf.len() as u64,
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        Ok(bytes.try_into().expect("take returned N bytes"))
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: impl Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(&what)?;
        let bytes = self.take(len, &what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 { what: what() })
    }

    fn value(&mut self, type_id: u32, key: &str) -> Result<MetadataValue, GgufError> {
        let what = || format!("the value of metadata key {key:?}");
        Ok(match type_id {
            0 => MetadataValue::U8(self.array::<1>(what)?[0]),
            1 => MetadataValue::I8(i8::from_le_bytes(self.array(what)?)),
            2 => MetadataValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => MetadataValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => MetadataValue::U32(u32::from_le_bytes(self.array(what)?)),
            5 => MetadataValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => MetadataValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => MetadataValue::Bool(self.array::<1>(what)?[0] != 0),
            8 => MetadataValue::String(self.string(what)?),
            9 => {
                let elem_type = self.u32(what)?;
                // GGUF files hold flat arrays; nesting is allowed, but not deep enough to
                // exhaust the stack on a crafted file.
                if elem_type == 9 && self.depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::BadValueType {
                        key: format!("{key} (arrays nested deeper than {MAX_ARRAY_DEPTH})"),
                        type_id: elem_type,
                    });
                }
                let count = self.u64(what)?;
                // Every element takes at least one byte: a larger count is corruption, and
                // checking first keeps a bad count from reserving absurd memory.
                let remaining = (self.buf.len() - self.pos) as u64;
                if count > remaining {
                    return Err(GgufError::Truncated {
                        what: what(),
                        offset: self.pos as u64,
                        needed: count,
                        len: self.buf.len() as u64,
                    });
                }
                // An element takes up to 32 bytes here for 1 in the file: reserve little up
                // front, so a corrupt count in a large file cannot reserve absurd memory.
                let mut items = Vec::with_capacity(count.min(4096) as usize);
                self.depth += 1;
                for _ in 0..count {
                    items.push(self.value(elem_type, key)?);
                }
                self.depth -= 1;
                MetadataValue::Array(items)
            }
            10 => MetadataValue::U64(u64::from_le_bytes(self.array(what)?)),
            11 => MetadataValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => MetadataValue::F64(f64::from_le_bytes(self.array(what)?)),
            other => {
                return Err(GgufError::BadValueType {
                    key: key.into(),
                    type_id: other,
                })
            }
        })
    }
}

#[cfg(test)]
#[path = "reader_tests.rs"]
mod tests;
