//! MLX errors thrown on MLX's stream thread, where a task of an `async_eval` graph runs: MLX
//! 0.32.2 keeps the exception on the stream and throws it at the next wait (or the next task
//! its main thread queues), so it reaches the reader as a `Result`; `device::synchronize` takes
//! one that nobody read. Provoked with real failures: a singular matrix's inverse (LAPACK
//! fails inside the task) and a weight file cut short after load (MLX reads weights lazily).
//! Shape mismatches never get that far (ops check shapes as the graph is built), and an
//! allocation MLX cannot get on the CPU is a crash, not an error: a generation is stopped once
//! MLX's memory passes its limit instead.

use mlx_rs::{linalg, transforms, Array, Stream};

use crate::{
    layers::device, CancelToken, Engine, EngineError, GenerateRequest, LoadRequest, Prompt,
};

/// The inverse of a singular matrix: it fails in LAPACK, inside a task on the stream thread.
fn failing_on_the_stream_thread() -> Array {
    let zeros = Array::zeros::<f32>(&[4, 4]).unwrap();
    mlx_rs::with_stream(&Stream::cpu(), || linalg::inv(&zeros)).unwrap()
}

fn six() -> f32 {
    let a = Array::from_f32(2.0) * Array::from_f32(3.0);
    a.try_item_exact::<f32>().unwrap()
}

/// Whichever comes first meets the error: the reader's wait, or (on MLX's main thread, the
/// first that used MLX) MLX queuing more work, here the end of `async_eval` itself.
#[test]
fn an_error_on_the_stream_thread_reaches_whoever_reads_the_result() {
    let _mlx = fixtures::mlx_test_lock();
    let _ = device::synchronize();
    let x = failing_on_the_stream_thread();
    let read = transforms::async_eval([&x]).and_then(|()| x.sum(None)?.eval());
    let e = read.unwrap_err();
    assert!(e.what().starts_with("[Inverse::eval_cpu]"), "{e}");
    assert_eq!(device::synchronize(), Ok(()));
    assert_eq!(six(), 6.0);
}

#[test]
fn a_failed_step_nobody_read_is_taken_by_synchronize_not_left_for_the_next_request() {
    let _mlx = fixtures::mlx_test_lock();
    let _ = device::synchronize();
    let x = failing_on_the_stream_thread();
    let queued = transforms::async_eval([&x]);
    drop(x);
    let settled = device::synchronize();
    // Once, in one of the two places (the stream keeps an error until one wait takes it).
    let errors: Vec<_> = [queued, settled]
        .into_iter()
        .filter_map(Result::err)
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].what().starts_with("[Inverse::eval_cpu]"));
    assert_eq!(device::synchronize(), Ok(()));
    assert_eq!(six(), 6.0);
}

/// An error in the graph a split attention waits on (`attention::sdpa` on the CPU's lanes)
/// reaches the reader; `synchronize` then leaves no copy on any lane for the next request.
#[test]
fn an_error_behind_a_split_attention_is_not_left_on_a_lane() {
    let _mlx = fixtures::mlx_test_lock();
    let _ = device::synchronize();
    // 2 heads x 512 x 512 scores: split over the lanes on a machine of two cores or more.
    let x = Array::ones::<f32>(&[1, 2, 512, 64]).unwrap();
    let split = |x: &Array| crate::layers::sdpa::sdpa(x, x, x, 0.125, None, None).unwrap();
    let poisoned = x
        .add(failing_on_the_stream_thread().sum(None).unwrap())
        .unwrap();
    let e = split(&poisoned).eval().unwrap_err();
    assert!(e.what().contains("[Inverse::eval_cpu]"), "{e}");
    let _ = device::synchronize();
    assert_eq!(device::synchronize(), Ok(()));
    let clean = split(&x);
    assert_eq!(clean.eval(), Ok(()));
    assert!(
        clean.eq_values(&x).unwrap(),
        "attention over equal keys returns the values"
    );
    assert_eq!(six(), 6.0);
}

fn load(engine: &mut Engine, dir: &std::path::Path, force: bool) {
    let req = LoadRequest {
        model: dir.display().to_string(),
        force,
        ..Default::default()
    };
    engine.load(&req, &mut |_| {}, &CancelToken::new()).unwrap();
}

fn generate(engine: &mut Engine, dir: &std::path::Path) -> Result<Vec<u32>, EngineError> {
    let mut req = GenerateRequest::greedy(Prompt::Tokens((10..20).collect()), 8);
    req.model = Some(dir.display().to_string());
    engine
        .generate(&req, &mut |_| {}, &CancelToken::new())
        .map(|c| c.token_ids)
}

/// Load reads every weight of the language model (pricing its caches runs a pass through all
/// of it, embedding table and output layer included): a weight file cut after load changes
/// nothing, where MLX would otherwise read the rest at the first generation.
#[test]
fn a_weight_file_cut_after_load_changes_nothing() {
    let _mlx = fixtures::mlx_test_lock();
    let dir = std::env::temp_dir().join(format!("mlx-stream-errors-{}", std::process::id()));
    fixtures::write_tiny_llama(&dir, &Default::default()).unwrap();
    let mut engine = Engine::new();
    load(&mut engine, &dir, false);
    fixtures::cut_after_header(&dir.join("model.safetensors")).unwrap();
    let after_cut = generate(&mut engine, &dir).unwrap();
    fixtures::write_tiny_llama(&dir, &Default::default()).unwrap();
    load(&mut engine, &dir, true);
    assert_eq!(generate(&mut engine, &dir).unwrap(), after_cut);
    drop(engine);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_shape_mismatch_fails_as_the_graph_is_built_before_anything_runs() {
    let _mlx = fixtures::mlx_test_lock();
    let a = Array::zeros::<f32>(&[2, 3]).unwrap();
    let b = Array::zeros::<f32>(&[4, 5]).unwrap();
    let e = mlx_rs::ops::matmul(&a, &b).unwrap_err();
    assert!(e.what().contains("[matmul]"), "{e}");
    assert_eq!(device::synchronize(), Ok(()));
}

#[test]
fn a_generation_past_the_memory_limit_stops_with_an_error_and_the_model_goes_on() {
    let _mlx = fixtures::mlx_test_lock();
    let dir = std::env::temp_dir().join(format!("mlx-headroom-{}", std::process::id()));
    fixtures::write_tiny_llama(&dir, &Default::default()).unwrap();
    let mut engine = Engine::new();
    load(&mut engine, &dir, false);
    let req = GenerateRequest::greedy(Prompt::Tokens((0..1200).map(|i| 10 + i % 200).collect()), 4);
    let before = engine
        .generate(&req, &mut |_| {}, &CancelToken::new())
        .unwrap();

    // The limit just above what is in use: the prompt's KV cache does not fit, and the request
    // is refused before anything is computed (`footprint::admit`).
    engine.reset(true);
    let active = mlx_rs::memory::active_memory().unwrap();
    let limit = mlx_rs::memory::set_memory_limit(active + 1).unwrap();
    let result = engine.generate(&req, &mut |_| {}, &CancelToken::new());
    // What a generation whose cache grew past the limit anyway meets between two passes.
    let grown = Array::zeros::<f32>(&[1024]).unwrap();
    transforms::eval([&grown]).unwrap();
    let headroom = crate::runtime::memory::check_headroom(512);
    mlx_rs::memory::set_memory_limit(limit).unwrap();
    match result {
        Err(EngineError::MemoryBudget {
            prompt_tokens,
            tokens_that_fit,
            ..
        }) => assert_eq!((prompt_tokens, tokens_that_fit), (1200, 0)),
        other => panic!("expected a memory budget error, got {other:?}"),
    }
    match headroom {
        Err(EngineError::Generation(message)) => {
            assert!(message.contains("passed its limit"), "{message}");
            assert!(message.contains("with 512 tokens"), "{message}");
        }
        other => panic!("expected a generation error, got {other:?}"),
    }
    let after = engine
        .generate(&req, &mut |_| {}, &CancelToken::new())
        .unwrap();
    assert_eq!(after.token_ids, before.token_ids);
    drop(engine);
    std::fs::remove_dir_all(&dir).unwrap();
}
