// Shared by the end-to-end tests: start the real binary through the protocol crate's client.

use std::time::Duration;

use protocol::{Client, ClientOptions};

pub fn worker(args: &[&str]) -> Client {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_mlx-worker"));
    command.args(args).env("MLX_WORKER_LOG", "debug");
    let options = ClientOptions {
        echo_stderr: std::env::var_os("ECHO_WORKER_STDERR").is_some(),
        ..Default::default()
    };
    Client::spawn_command(command, options).expect("start mlx-worker")
}

pub async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("timed out")
}
