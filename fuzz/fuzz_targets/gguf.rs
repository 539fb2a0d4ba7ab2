//! Arbitrary bytes as a GGUF file: parsing, the metadata accessors and reading every small
//! tensor must end in a value or an error, never a panic, a hang or an absurd allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = gguf::GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let _ = file.architecture();
    for (key, value) in file.metadata() {
        let _ = (key.len(), value.type_name(), value.as_u64(), value.as_str());
    }
    for info in file.tensors() {
        let _ = (info.shape(), info.byte_len(), file.tensor_data(info));
        if info.n_elements() <= 1 << 16 {
            let _ = file.dequantize(&info.name);
        }
    }
});
