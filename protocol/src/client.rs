//! The host side: spawn `mlx-worker`, send requests, stream deltas, cancel, shut down.
//!
//! A [`Client`] owns the child process and three tasks: one writes stdin, one reads stdout and
//! routes each message (responses to their callers, `generate/delta` to its [`GenerateHandle`],
//! other notifications and responses nobody waits for to queues of their own), one keeps the
//! last bytes of stderr for error reports. When the worker dies, every pending request fails
//! with [`ClientError::WorkerExited`], which carries the exit status and stderr's tail.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot, watch, Mutex};

use crate::codec::{decode_message, encode_message, LineReader, DEFAULT_MAX_LINE_BYTES};
use crate::envelope::{Message, Notification, Request, RequestId, Response};
use crate::error::ResponseError;
use crate::methods::{
    Cancel, CancelParams, CancelResult, Generate, GenerateDelta, GenerateDeltaNotification,
    GenerateParams, GenerateResult, Method, NotificationMethod, Shutdown, ShutdownParams,
};

/// How long the stdout reader waits for the exit status and stderr after stdout closes, before
/// failing pending requests without them.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// What can go wrong talking to the worker.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The worker could not be started.
    #[error("could not start the worker `{program}`: {source}; check the path (build it with `cargo build -p mlx-worker`)")]
    Spawn {
        /// The program that was run.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The worker answered with an error.
    #[error(transparent)]
    Rpc(#[from] ResponseError),
    /// The worker's stdout closed (it exited or crashed) before the answer came.
    #[error("the worker exited ({}) before answering; last stderr:\n{stderr_tail}", describe_status(.status))]
    WorkerExited {
        /// Its exit status, when it was known in time.
        status: Option<ExitStatus>,
        /// The last bytes it wrote to stderr.
        stderr_tail: String,
    },
    /// The worker's stdin is closed ([`Client::close_stdin`] was called or it stopped reading).
    #[error("the worker's stdin is closed; no more messages can be sent")]
    StdinClosed,
    /// A result arrived but does not have the expected shape.
    #[error("the worker's result for `{method}` does not have the expected shape: {source}")]
    BadResult {
        /// The method called.
        method: String,
        /// What serde found.
        source: serde_json::Error,
    },
    /// Params could not be serialised.
    #[error("params for `{method}` could not be serialised: {source}")]
    BadParams {
        /// The method called.
        method: String,
        /// What serde found.
        source: serde_json::Error,
    },
    /// Waiting for the process failed.
    #[error("waiting for the worker failed: {0}")]
    Io(#[from] std::io::Error),
}

fn describe_status(status: &Option<ExitStatus>) -> String {
    match status {
        Some(s) => s.to_string(),
        None => "exit status unknown".to_owned(),
    }
}

/// Options of [`Client::spawn_command`].
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Copy the worker's stderr to ours as it arrives (default false).
    pub echo_stderr: bool,
    /// Keep this many of stderr's last bytes for [`Client::stderr_tail`] (default 64 KiB).
    pub stderr_tail_bytes: usize,
    /// Longest line accepted from the worker's stdout (default 64 MiB).
    pub max_line_bytes: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            echo_stderr: false,
            stderr_tail_bytes: 64 * 1024,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        }
    }
}

/// State shared between the client, its handles and its tasks.
#[derive(Debug)]
struct Shared {
    routes: StdMutex<Routes>,
    stderr: StdMutex<VecDeque<u8>>,
    stderr_tail_bytes: usize,
}

#[derive(Debug, Default)]
struct Routes {
    pending: HashMap<RequestId, oneshot::Sender<Response>>,
    streams: HashMap<RequestId, mpsc::UnboundedSender<GenerateDelta>>,
    /// Set once stdout closed: (exit status, stderr tail).
    closed: Option<(Option<ExitStatus>, String)>,
    /// Lines on stdout that were not protocol messages.
    stray_lines: Vec<String>,
}

impl Shared {
    fn stderr_tail(&self) -> String {
        let buf = self.stderr.lock().expect("stderr lock");
        let (a, b) = buf.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn exited_error(&self) -> ClientError {
        let routes = self.routes.lock().expect("routes lock");
        let (status, stderr_tail) = routes
            .closed
            .clone()
            .unwrap_or_else(|| (None, self.stderr_tail()));
        ClientError::WorkerExited {
            status,
            stderr_tail,
        }
    }
}

enum Outgoing {
    Bytes(Vec<u8>),
    CloseStdin,
}

/// A running worker and the JSON-RPC session with it.
#[derive(Debug)]
pub struct Client {
    shared: Arc<Shared>,
    outgoing: mpsc::UnboundedSender<Outgoing>,
    next_id: AtomicI64,
    unmatched: Mutex<mpsc::UnboundedReceiver<Response>>,
    notifications: Mutex<mpsc::UnboundedReceiver<Notification>>,
    exit: watch::Receiver<Option<Result<ExitStatus, String>>>,
    kill: StdMutex<Option<oneshot::Sender<()>>>,
    pid: Option<u32>,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outgoing::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Outgoing::CloseStdin => f.write_str("CloseStdin"),
        }
    }
}

impl Client {
    /// Starts `program` with `args` and extra environment `envs`, stdin/stdout piped for the
    /// protocol and stderr captured. The child is killed when the client is dropped.
    pub fn spawn<I, S, J, K, V>(
        program: impl AsRef<OsStr>,
        args: I,
        envs: J,
    ) -> Result<Client, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
        J: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let mut command = Command::new(program);
        command.args(args).envs(envs);
        Client::spawn_command(command, ClientOptions::default())
    }

    /// Starts a prepared command; its stdin, stdout and stderr are replaced by pipes.
    pub fn spawn_command(
        mut command: Command,
        options: ClientOptions,
    ) -> Result<Client, ClientError> {
        let program = command
            .as_std()
            .get_program()
            .to_string_lossy()
            .into_owned();
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .map_err(|source| ClientError::Spawn { program, source })?;
        let pid = child.id();
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");

        let shared = Arc::new(Shared {
            routes: StdMutex::new(Routes::default()),
            stderr: StdMutex::new(VecDeque::new()),
            stderr_tail_bytes: options.stderr_tail_bytes,
        });
        let (outgoing, outgoing_rx) = mpsc::unbounded_channel();
        let (unmatched_tx, unmatched) = mpsc::unbounded_channel();
        let (notifications_tx, notifications) = mpsc::unbounded_channel();
        let (exit_tx, exit) = watch::channel(None);
        let (kill, kill_rx) = oneshot::channel();
        let (stderr_done_tx, stderr_done) = oneshot::channel();

        tokio::spawn(write_stdin(stdin, outgoing_rx));
        tokio::spawn(supervise(child, kill_rx, exit_tx));
        tokio::spawn(read_stderr(
            stderr,
            shared.clone(),
            options.echo_stderr,
            stderr_done_tx,
        ));
        tokio::spawn(read_stdout(
            stdout,
            options.max_line_bytes,
            shared.clone(),
            unmatched_tx,
            notifications_tx,
            exit.clone(),
            stderr_done,
        ));

        Ok(Client {
            shared,
            outgoing,
            next_id: AtomicI64::new(1),
            unmatched: Mutex::new(unmatched),
            notifications: Mutex::new(notifications),
            exit,
            kill: StdMutex::new(Some(kill)),
            pid,
        })
    }

    /// The child's process id (`None` once it has been reaped).
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// A fresh numeric request id.
    pub fn next_id(&self) -> RequestId {
        RequestId::Number(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Calls `method` with `params` and decodes its result as `R`.
    pub async fn request<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<R, ClientError> {
        let params = serde_json::to_value(params).map_err(|source| ClientError::BadParams {
            method: method.to_owned(),
            source,
        })?;
        let value = self.request_value(method, params).await?;
        serde_json::from_value(value).map_err(|source| ClientError::BadResult {
            method: method.to_owned(),
            source,
        })
    }

    /// Calls the method `M` with typed params, e.g. `client.call::<Status>(&Default::default())`.
    pub async fn call<M: Method>(&self, params: &M::Params) -> Result<M::Result, ClientError> {
        self.request(M::NAME, params).await
    }

    /// Calls `method` with raw JSON params (`Value::Null` omits them) and returns the raw result.
    pub async fn request_value(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        let id = self.next_id();
        let response = self.register(id.clone())?;
        self.send_message(&Message::Request(Request {
            id: id.clone(),
            method: method.to_owned(),
            params,
        }))
        .inspect_err(|_| self.forget(&id))?;
        let response = response.await.map_err(|_| self.shared.exited_error())?;
        Ok(response.outcome?)
    }

    /// Starts a `generate`; its deltas and its result come through the returned handle.
    pub fn generate(&self, params: &GenerateParams) -> Result<GenerateHandle, ClientError> {
        let params = serde_json::to_value(params).map_err(|source| ClientError::BadParams {
            method: Generate::NAME.to_owned(),
            source,
        })?;
        self.generate_value(params)
    }

    /// Starts a `generate` with raw JSON params (to test defaults or bad fields).
    pub fn generate_value(&self, params: Value) -> Result<GenerateHandle, ClientError> {
        let id = self.next_id();
        let (deltas_tx, deltas) = mpsc::unbounded_channel();
        let response = {
            let response = self.register(id.clone())?;
            let mut routes = self.shared.routes.lock().expect("routes lock");
            routes.streams.insert(id.clone(), deltas_tx);
            response
        };
        self.send_message(&Message::Request(Request {
            id: id.clone(),
            method: Generate::NAME.to_owned(),
            params,
        }))
        .inspect_err(|_| self.forget(&id))?;
        Ok(GenerateHandle {
            id,
            deltas,
            response,
            shared: self.shared.clone(),
        })
    }

    /// Asks the worker to cancel the queued or running request `id`.
    pub async fn cancel(&self, id: &RequestId) -> Result<CancelResult, ClientError> {
        self.call::<Cancel>(&CancelParams {
            request_id: id.clone(),
        })
        .await
    }

    /// Sends a notification (no answer).
    pub fn notify(&self, method: &str, params: impl Serialize) -> Result<(), ClientError> {
        let params = serde_json::to_value(params).map_err(|source| ClientError::BadParams {
            method: method.to_owned(),
            source,
        })?;
        self.send_message(&Message::Notification(Notification {
            method: method.to_owned(),
            params,
        }))
    }

    /// Sends a typed notification `N`.
    pub fn notify_typed<N: NotificationMethod>(
        &self,
        params: &N::Params,
    ) -> Result<(), ClientError> {
        self.notify(N::NAME, params)
    }

    /// Writes these bytes to the worker's stdin exactly as given (add the `\n` yourself); for
    /// tests that send malformed input.
    pub fn send_raw(&self, bytes: impl Into<Vec<u8>>) -> Result<(), ClientError> {
        self.outgoing
            .send(Outgoing::Bytes(bytes.into()))
            .map_err(|_| ClientError::StdinClosed)
    }

    /// Writes one message.
    pub fn send_message(&self, message: &Message) -> Result<(), ClientError> {
        self.send_raw(encode_message(message))
    }

    /// The next response that no caller waits for (an id-null error, or an answer to a request
    /// sent with [`Client::send_raw`]); `None` once the worker's stdout is closed.
    pub async fn next_unmatched(&self) -> Option<Response> {
        self.unmatched.lock().await.recv().await
    }

    /// The next notification other than a `generate/delta` routed to a handle (e.g.
    /// `load/progress`); `None` once the worker's stdout is closed.
    pub async fn next_notification(&self) -> Option<Notification> {
        self.notifications.lock().await.recv().await
    }

    /// Lines the worker wrote to stdout that were not protocol messages (should be none).
    pub fn stray_stdout_lines(&self) -> Vec<String> {
        self.shared
            .routes
            .lock()
            .expect("routes lock")
            .stray_lines
            .clone()
    }

    /// Closes the worker's stdin (the worker sees end of input and should exit).
    pub fn close_stdin(&self) {
        let _ = self.outgoing.send(Outgoing::CloseStdin);
    }

    /// Sends `shutdown`, waits for its `{}`, then for the process to exit.
    pub async fn shutdown(&self) -> Result<ExitStatus, ClientError> {
        self.call::<Shutdown>(&ShutdownParams {}).await?;
        self.wait().await
    }

    /// Waits for the process to exit.
    pub async fn wait(&self) -> Result<ExitStatus, ClientError> {
        let mut exit = self.exit.clone();
        let status = exit
            .wait_for(Option::is_some)
            .await
            .map_err(|_| std::io::Error::other("the process supervisor stopped"))?
            .clone()
            .expect("waited for Some");
        status.map_err(|e| ClientError::Io(std::io::Error::other(e)))
    }

    /// Kills the process (SIGKILL); [`Client::wait`] then reports how it ended.
    pub fn kill(&self) {
        if let Some(kill) = self.kill.lock().expect("kill lock").take() {
            let _ = kill.send(());
        }
    }

    /// The last bytes (up to [`ClientOptions::stderr_tail_bytes`]) the worker wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        self.shared.stderr_tail()
    }

    fn register(&self, id: RequestId) -> Result<oneshot::Receiver<Response>, ClientError> {
        let (tx, rx) = oneshot::channel();
        let mut routes = self.shared.routes.lock().expect("routes lock");
        if let Some((status, stderr_tail)) = routes.closed.clone() {
            return Err(ClientError::WorkerExited {
                status,
                stderr_tail,
            });
        }
        routes.pending.insert(id, tx);
        Ok(rx)
    }

    fn forget(&self, id: &RequestId) {
        let mut routes = self.shared.routes.lock().expect("routes lock");
        routes.pending.remove(id);
        routes.streams.remove(id);
    }
}

/// A running `generate`: its id, its deltas as they arrive, then its result.
#[derive(Debug)]
pub struct GenerateHandle {
    id: RequestId,
    deltas: mpsc::UnboundedReceiver<GenerateDelta>,
    response: oneshot::Receiver<Response>,
    shared: Arc<Shared>,
}

impl GenerateHandle {
    /// The request's id (to pass to [`Client::cancel`]).
    pub fn id(&self) -> &RequestId {
        &self.id
    }

    /// The next delta; `None` once the generation has answered (or the worker died).
    pub async fn next_delta(&mut self) -> Option<GenerateDelta> {
        self.deltas.recv().await
    }

    /// Waits for the result; deltas not yet read are dropped.
    pub async fn finish(self) -> Result<GenerateResult, ClientError> {
        let response = self
            .response
            .await
            .map_err(|_| self.shared.exited_error())?;
        let value = response.outcome?;
        serde_json::from_value(value).map_err(|source| ClientError::BadResult {
            method: Generate::NAME.to_owned(),
            source,
        })
    }

    /// Reads every delta, then the result.
    pub async fn collect(mut self) -> Result<(Vec<GenerateDelta>, GenerateResult), ClientError> {
        let mut deltas = Vec::new();
        while let Some(delta) = self.deltas.recv().await {
            deltas.push(delta);
        }
        let result = self.finish().await?;
        Ok((deltas, result))
    }
}

async fn write_stdin(mut stdin: ChildStdin, mut outgoing: mpsc::UnboundedReceiver<Outgoing>) {
    while let Some(item) = outgoing.recv().await {
        match item {
            Outgoing::Bytes(bytes) => {
                if stdin.write_all(&bytes).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
            Outgoing::CloseStdin => break,
        }
    }
    // Dropping stdin closes the pipe: the worker sees end of input.
}

async fn supervise(
    mut child: tokio::process::Child,
    kill: oneshot::Receiver<()>,
    exit: watch::Sender<Option<Result<ExitStatus, String>>>,
) {
    let status = tokio::select! {
        status = child.wait() => status,
        // An explicit kill, or the client was dropped.
        _ = kill => {
            let _ = child.start_kill();
            child.wait().await
        }
    };
    let _ = exit.send(Some(status.map_err(|e| e.to_string())));
}

async fn read_stderr(
    mut stderr: ChildStderr,
    shared: Arc<Shared>,
    echo: bool,
    done: oneshot::Sender<()>,
) {
    let mut chunk = vec![0u8; 8192];
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if echo {
            eprint!("{}", String::from_utf8_lossy(&chunk[..n]));
        }
        let mut tail = shared.stderr.lock().expect("stderr lock");
        tail.extend(&chunk[..n]);
        let excess = tail.len().saturating_sub(shared.stderr_tail_bytes);
        tail.drain(..excess);
    }
    let _ = done.send(());
}

async fn read_stdout(
    stdout: ChildStdout,
    max_line_bytes: usize,
    shared: Arc<Shared>,
    unmatched: mpsc::UnboundedSender<Response>,
    notifications: mpsc::UnboundedSender<Notification>,
    mut exit: watch::Receiver<Option<Result<ExitStatus, String>>>,
    stderr_done: oneshot::Receiver<()>,
) {
    let mut lines = LineReader::new(BufReader::new(stdout), max_line_bytes);
    while let Some(line) = lines.next_line().await {
        let line = match line {
            Ok(line) => line,
            Err(crate::codec::LineError::Io(_)) => break,
            Err(e) => {
                record_stray(&shared, format!("<{e}>"));
                continue;
            }
        };
        match decode_message(&line) {
            Ok(Message::Response(response)) => {
                let waiter = response.id.as_ref().and_then(|id| {
                    let mut routes = shared.routes.lock().expect("routes lock");
                    // The stream ends with its response: every delta came before it.
                    routes.streams.remove(id);
                    routes.pending.remove(id)
                });
                match waiter {
                    Some(waiter) => {
                        let _ = waiter.send(response);
                    }
                    None => {
                        let _ = unmatched.send(response);
                    }
                }
            }
            Ok(Message::Notification(notification)) => {
                route_notification(&shared, &notifications, notification)
            }
            // The contract has no worker-to-host requests.
            Ok(Message::Request(request)) => record_stray(
                &shared,
                format!("<unexpected request `{}`>", request.method),
            ),
            Err(_) => record_stray(&shared, line),
        }
    }

    // Stdout is closed: learn how the worker ended, then fail whoever still waits.
    let status = tokio::time::timeout(EXIT_GRACE, exit.wait_for(Option::is_some))
        .await
        .ok()
        .and_then(|r| r.ok().and_then(|s| s.clone()))
        .and_then(Result::ok);
    let _ = tokio::time::timeout(EXIT_GRACE, stderr_done).await;
    let tail = shared.stderr_tail();
    let mut routes = shared.routes.lock().expect("routes lock");
    routes.closed = Some((status, tail));
    routes.pending.clear();
    routes.streams.clear();
}

fn route_notification(
    shared: &Shared,
    notifications: &mpsc::UnboundedSender<Notification>,
    notification: Notification,
) {
    if notification.method == GenerateDeltaNotification::NAME {
        if let Ok(delta) = serde_json::from_value::<GenerateDelta>(notification.params.clone()) {
            let routes = shared.routes.lock().expect("routes lock");
            if let Some(stream) = routes.streams.get(&delta.request_id) {
                let _ = stream.send(delta);
                return;
            }
        }
    }
    let _ = notifications.send(notification);
}

fn record_stray(shared: &Shared, line: String) {
    const KEEP: usize = 100;
    let mut routes = shared.routes.lock().expect("routes lock");
    if routes.stray_lines.len() < KEEP {
        routes.stray_lines.push(line);
    }
}
