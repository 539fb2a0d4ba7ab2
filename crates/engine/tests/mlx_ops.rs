//! The sys layer on this machine: MLX ops through mlx-rs give the right numbers.

use mlx_rs::{array, fast, ops, random, Array, Dtype};

fn close(a: &Array, b: &Array, tol: f32) -> bool {
    a.all_close(b, tol as f64, tol as f64, None).unwrap()
}

#[test]
fn matmul_matches_hand_computed() {
    let _mlx = fixtures::mlx_test_lock();
    let a = array!([[1.0f32, 2.0], [3.0, 4.0]]);
    let b = array!([[5.0f32, 6.0], [7.0, 8.0]]);
    let c = a.matmul(&b).unwrap();
    assert!(close(&c, &array!([[19.0f32, 22.0], [43.0, 50.0]]), 1e-6));
}

#[test]
fn large_float32_matmul_is_right() {
    let _mlx = fixtures::mlx_test_lock();
    // Big enough to go through cblas_sgemm (OpenBLAS here): ones(64x300) @ ones(300x32) = 300.
    let a = ops::ones::<f32>(&[64, 300]).unwrap();
    let b = ops::ones::<f32>(&[300, 32]).unwrap();
    let c = a.matmul(&b).unwrap();
    assert!(close(
        &c,
        &ops::full::<f32>(&[64, 32], array!(300.0f32)).unwrap(),
        1e-4
    ));
}

#[test]
fn rms_norm_matches_definition() {
    let _mlx = fixtures::mlx_test_lock();
    let x = array!([[1.0f32, 2.0, 3.0, 4.0]]);
    let w = array!([1.0f32, 1.0, 2.0, 0.5]);
    let y = fast::rms_norm(&x, Some(&w), 1e-5).unwrap();
    let rms = ((1.0f32 + 4.0 + 9.0 + 16.0) / 4.0 + 1e-5).sqrt();
    let expected = array!([[1.0 / rms, 2.0 / rms, 6.0 / rms, 2.0 / rms]]);
    assert!(close(&y, &expected, 1e-5));
}

#[test]
fn quantized_matmul_approximates_dense() {
    let _mlx = fixtures::mlx_test_lock();
    random::seed(7).unwrap();
    let w = random::normal::<f32>(&[128, 256], None, None, None).unwrap();
    let x = random::normal::<f32>(&[4, 256], None, None, None).unwrap();
    let (wq, scales, biases) = ops::quantize(&w, 64, 8).unwrap();
    let y = ops::quantized_matmul(&x, &wq, &scales, &biases, true, 64, 8).unwrap();
    // Exactly the dense product with the dequantized weights, and near the original weights.
    let wd = ops::dequantize(&wq, &scales, &biases, 64, 8).unwrap();
    assert!(close(&y, &x.matmul(wd.t()).unwrap(), 1e-4));
    let err = ops::abs(&(&wd - &w))
        .unwrap()
        .max(None)
        .unwrap()
        .item_exact::<f32>();
    assert!(err < 0.05, "8-bit quantization error {err}");
}

#[test]
fn argmax_and_dtypes() {
    let _mlx = fixtures::mlx_test_lock();
    let x = array!([0.1f32, 3.0, -2.0, 2.5]);
    assert_eq!(
        ops::indexing::argmax_axis(&x, 0, None)
            .unwrap()
            .item_exact::<u32>(),
        1
    );
    let h = x.as_dtype(Dtype::Bfloat16).unwrap();
    assert_eq!(h.dtype(), Dtype::Bfloat16);
    let f = x.as_dtype(Dtype::Float16).unwrap();
    assert_eq!(f.as_slice::<half::f16>()[1], half::f16::from_f32(3.0));
    assert_eq!(h.as_slice::<half::bf16>()[3], half::bf16::from_f32(2.5));
}
