use super::*;
use crate::test_file::TestGguf;
use MetadataValue as V;

fn all_value_types() -> TestGguf {
    TestGguf::new()
        .kv("u8", V::U8(200))
        .kv("i8", V::I8(-5))
        .kv("u16", V::U16(60000))
        .kv("i16", V::I16(-300))
        .kv("u32", V::U32(4_000_000_000))
        .kv("i32", V::I32(-70000))
        .kv("u64", V::U64(1 << 40))
        .kv("i64", V::I64(-(1 << 40)))
        .kv("f32", V::F32(1e-5))
        .kv("f64", V::F64(0.125))
        .kv("bool", V::Bool(true))
        .kv("str", V::String("héllo".into()))
        .kv(
            "strs",
            V::Array(vec![V::String("a b".into()), V::String(String::new())]),
        )
        .kv("ints", V::Array(vec![V::I32(1), V::I32(-2), V::I32(3)]))
        .kv(
            "nested",
            V::Array(vec![
                V::Array(vec![V::U8(1)]),
                V::Array(vec![V::U8(2), V::U8(3)]),
            ]),
        )
        .f32_tensor("a", &[3, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
        .f32_tensor("b", &[5], &[9.0; 5])
}

#[test]
fn parses_every_value_type_in_v2_and_v3() {
    for version in [2, 3] {
        let mut spec = all_value_types();
        spec.version = version;
        let file = GgufFile::from_bytes(spec.build()).unwrap();
        assert_eq!(file.version(), version);
        assert_eq!(file.metadata(), spec.metadata.as_slice());
        assert_eq!(file.require::<u64>("u32").unwrap(), 4_000_000_000);
        assert_eq!(file.require::<i64>("i16").unwrap(), -300);
        assert_eq!(file.require::<f64>("f32").unwrap(), f64::from(1e-5f32));
        assert_eq!(file.require::<Vec<String>>("strs").unwrap(), ["a b", ""]);
        assert_eq!(file.require::<Vec<i64>>("ints").unwrap(), [1, -2, 3]);
        assert!(file.get_as::<u64>("absent").unwrap().is_none());
        assert!(matches!(
            file.require::<u64>("absent"),
            Err(GgufError::MissingKey(_))
        ));
        assert!(matches!(
            file.require::<u64>("i8"),
            Err(GgufError::WrongType { .. })
        ));
        assert!(matches!(
            file.require::<String>("u8"),
            Err(GgufError::WrongType { .. })
        ));
    }
}

#[test]
fn tensors_are_row_major_and_aligned() {
    for alignment in [None, Some(64u32), Some(48)] {
        let mut spec = all_value_types();
        if let Some(a) = alignment {
            spec = spec.kv("general.alignment", V::U32(a));
        }
        let file = GgufFile::from_bytes(spec.build()).unwrap();
        assert_eq!(file.alignment(), u64::from(alignment.unwrap_or(32)));
        let a = file.tensor("a").unwrap();
        assert_eq!(a.dims, [3, 2]);
        assert_eq!(a.shape(), [2, 3]);
        assert_eq!(
            file.dequantize("a").unwrap(),
            [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        );
        assert_eq!(file.dequantize("b").unwrap(), [9.0; 5]);
        assert_eq!(file.tensor("b").unwrap().offset % file.alignment(), 0);
        assert!(matches!(
            file.dequantize("c"),
            Err(GgufError::MissingTensor(_))
        ));
    }
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = all_value_types().build();
    for len in 0..bytes.len() {
        let err = GgufFile::from_bytes(bytes[..len].to_vec()).unwrap_err();
        assert!(
            matches!(
                err,
                GgufError::Truncated { .. } | GgufError::BadMagic { .. }
            ),
            "prefix of {len} bytes: {err}"
        );
    }
}

#[test]
fn rejects_bad_headers() {
    let mut bytes = all_value_types().build();
    bytes[0] = b'X';
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::BadMagic { .. })
    ));

    let mut spec = all_value_types();
    spec.version = 1;
    assert!(matches!(
        GgufFile::from_bytes(spec.build()),
        Err(GgufError::UnsupportedVersion(1))
    ));

    // A huge array count must not be trusted for allocation.
    let mut bytes = TestGguf::new().kv("x", V::Array(vec![V::U8(1)])).build();
    // header 24 bytes, key 8 + 1, value type 4, element type 4, then the count.
    let count_at = 24 + 9 + 4 + 4;
    assert_eq!(bytes[count_at], 1);
    bytes[count_at..count_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::Truncated { .. })
    ));

    // Arrays nested a million deep end with an error, not a stack overflow.
    let mut bytes = TestGguf::new().build();
    bytes[16..24].copy_from_slice(&1u64.to_le_bytes()); // one metadata key
    bytes.truncate(24);
    bytes.extend(1u64.to_le_bytes());
    bytes.push(b'x');
    bytes.extend(9u32.to_le_bytes()); // an array
    for _ in 0..1_000_000 {
        bytes.extend(9u32.to_le_bytes()); // of arrays
        bytes.extend(1u64.to_le_bytes()); // of one element
    }
    match GgufFile::from_bytes(bytes) {
        Err(GgufError::BadValueType { key, type_id: 9 }) => assert!(key.contains("nested")),
        other => panic!("expected a nesting error, got {other:?}"),
    }
}

#[test]
fn unknown_tensor_types_open_but_do_not_read() {
    let mut spec = TestGguf::new();
    spec.tensors
        .push(("iq".into(), vec![256], GgmlType::Unknown(19), vec![0; 50]));
    let file = GgufFile::from_bytes(spec.build()).unwrap();
    assert_eq!(file.tensor("iq").unwrap().ggml_type, GgmlType::Unknown(19));
    assert!(matches!(
        file.dequantize("iq"),
        Err(GgufError::BadTensor { .. })
    ));
}

#[test]
fn duplicate_names_and_overflowing_dimensions_are_refused() {
    // Found by `fuzz/gguf`: a second tensor of the same name made `dequantize(name)` read
    // another tensor than the one checked.
    let twice = TestGguf::new()
        .f32_tensor("w", &[2], &[1.0, 2.0])
        .f32_tensor("w", &[1], &[3.0])
        .build();
    match GgufFile::from_bytes(twice) {
        Err(GgufError::BadTensor { name, reason }) => {
            assert_eq!(name, "w");
            assert!(reason.contains("twice"), "{reason}");
        }
        other => panic!("expected a duplicate-name error, got {other:?}"),
    }
    let mut spec = TestGguf::new().f32_tensor("w", &[2, 2], &[0.0; 4]);
    spec.tensors[0].1 = vec![u64::MAX, 4];
    match GgufFile::from_bytes(spec.build()) {
        Err(GgufError::BadTensor { reason, .. }) => assert!(reason.contains("2^64"), "{reason}"),
        other => panic!("expected an overflow error, got {other:?}"),
    }
}
