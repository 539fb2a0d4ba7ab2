//! Builds GGUF files in memory for the unit tests (the writer side of the format).

use crate::{GgmlType, MetadataValue};

pub(crate) struct TestGguf {
    pub version: u32,
    pub metadata: Vec<(String, MetadataValue)>,
    /// name, GGUF dims (fastest first), type, bytes
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl TestGguf {
    pub fn new() -> Self {
        Self {
            version: 3,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    pub fn kv(mut self, key: &str, value: MetadataValue) -> Self {
        self.metadata.push((key.to_owned(), value));
        self
    }

    pub fn f32_tensor(mut self, name: &str, dims: &[u64], values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensors
            .push((name.to_owned(), dims.to_vec(), GgmlType::F32, bytes));
        self
    }

    pub fn alignment(&self) -> usize {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .unwrap_or(32) as usize
    }

    pub fn build(&self) -> Vec<u8> {
        let align = self.alignment();
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend(type_id(value).to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for (name, dims, ty, bytes) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.id().to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + bytes.len()).next_multiple_of(align);
        }
        let data_start = out.len().next_multiple_of(align);
        out.resize(data_start, 0);
        for ((_, _, _, bytes), off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend(bytes);
        }
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn type_id(v: &MetadataValue) -> u32 {
    use MetadataValue::*;
    match v {
        U8(_) => 0,
        I8(_) => 1,
        U16(_) => 2,
        I16(_) => 3,
        U32(_) => 4,
        I32(_) => 5,
        F32(_) => 6,
        Bool(_) => 7,
        String(_) => 8,
        Array(_) => 9,
        U64(_) => 10,
        I64(_) => 11,
        F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &MetadataValue) {
    use MetadataValue::*;
    match v {
        U8(x) => out.push(*x),
        I8(x) => out.extend(x.to_le_bytes()),
        U16(x) => out.extend(x.to_le_bytes()),
        I16(x) => out.extend(x.to_le_bytes()),
        U32(x) => out.extend(x.to_le_bytes()),
        I32(x) => out.extend(x.to_le_bytes()),
        U64(x) => out.extend(x.to_le_bytes()),
        I64(x) => out.extend(x.to_le_bytes()),
        F32(x) => out.extend(x.to_le_bytes()),
        F64(x) => out.extend(x.to_le_bytes()),
        Bool(x) => out.push(u8::from(*x)),
        String(s) => put_str(out, s),
        Array(items) => {
            out.extend(items.first().map_or(4, type_id).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}
