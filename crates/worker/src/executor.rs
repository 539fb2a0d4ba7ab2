//! The MLX thread: the one thread that touches the engine. It runs one job at a time, sends its
//! notifications and its response straight to stdout's outbox (so deltas always precede their
//! response), then tells the dispatcher it is free.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};

use protocol::methods::{
    GenerateDelta, GenerateDeltaNotification, GenerateParams, LoadParams, LoadProgress,
    LoadProgressNotification, NotificationMethod, UnloadParams, WorkerState,
};
use protocol::{Notification, RequestId, Response, ResponseError};
use tokio::sync::{mpsc, oneshot};

use crate::backend::{Backend, BackendInfo, Residents, TokenizeService};
use crate::transport::Outbox;

/// Work that must run on the MLX thread, in arrival order.
#[derive(Debug)]
pub enum Work {
    /// `load`.
    Load(Box<LoadParams>),
    /// `generate`.
    Generate(Box<GenerateParams>),
    /// `unload`.
    Unload(UnloadParams),
    /// `reset`.
    Reset,
}

impl Work {
    /// What `status` says while this runs.
    pub fn state(&self) -> WorkerState {
        match self {
            Work::Load(_) => WorkerState::Loading,
            Work::Generate(_) => WorkerState::Generating,
            Work::Unload(_) | Work::Reset => WorkerState::Idle,
        }
    }
}

/// A request to run, with the flag that cancels it.
pub struct Job<C> {
    /// The request's id.
    pub id: RequestId,
    /// What to do.
    pub work: Work,
    /// Set by `cancel`; polled by the engine.
    pub cancel: C,
}

/// What the MLX thread tells the dispatcher.
pub enum ExecutorEvent {
    /// The engine is up.
    Ready {
        /// For `initialize`.
        info: BackendInfo,
        /// For `tokenize`.
        tokenizer: Arc<dyn TokenizeService>,
    },
    /// The engine could not start; engine requests will fail with this.
    Failed(String),
    /// The job with this id has answered; the thread is free.
    Done(RequestId),
}

enum Command<C> {
    Run(Job<C>),
    Quit,
}

/// The dispatcher's handle on the MLX thread.
pub struct Executor<C> {
    commands: std_mpsc::Sender<Command<C>>,
    stopped: Option<oneshot::Receiver<()>>,
}

impl<C: Send + 'static> Executor<C> {
    /// Starts the MLX thread; `make_backend` runs on it (engines need not be `Send`).
    pub fn spawn<B, F>(
        make_backend: F,
        outbox: Outbox,
        events: mpsc::UnboundedSender<ExecutorEvent>,
        residents: Arc<Mutex<Residents>>,
    ) -> Executor<C>
    where
        B: Backend<Cancel = C>,
        F: FnOnce() -> Result<B, String> + Send + 'static,
    {
        let (commands, command_rx) = std_mpsc::channel();
        let (stopped_tx, stopped) = oneshot::channel();
        std::thread::Builder::new()
            .name("mlx".into())
            .spawn(move || {
                run(make_backend, command_rx, outbox, events, residents);
                let _ = stopped_tx.send(());
            })
            .expect("spawn the MLX thread");
        Executor {
            commands,
            stopped: Some(stopped),
        }
    }

    /// Hands a job to the MLX thread; call only when it is free.
    pub fn run(&self, job: Job<C>) {
        let _ = self.commands.send(Command::Run(job));
    }

    /// Asks the thread to free everything and stop after the current job, and waits at most
    /// `timeout` for it. Returns whether it stopped in time.
    pub async fn quit(&mut self, timeout: std::time::Duration) -> bool {
        let _ = self.commands.send(Command::Quit);
        match self.stopped.take() {
            Some(stopped) => tokio::time::timeout(timeout, stopped).await.is_ok(),
            None => true,
        }
    }
}

fn run<B: Backend, F: FnOnce() -> Result<B, String>>(
    make_backend: F,
    commands: std_mpsc::Receiver<Command<B::Cancel>>,
    outbox: Outbox,
    events: mpsc::UnboundedSender<ExecutorEvent>,
    residents: Arc<Mutex<Residents>>,
) {
    let mut backend = match catch_unwind(AssertUnwindSafe(make_backend)) {
        Ok(Ok(backend)) => backend,
        Ok(Err(e)) => return fail_all(e, commands, outbox, events),
        Err(_) => {
            return fail_all(
                "the engine panicked while starting".into(),
                commands,
                outbox,
                events,
            )
        }
    };
    let _ = events.send(ExecutorEvent::Ready {
        info: backend.info(),
        tokenizer: backend.tokenizer(),
    });
    *residents.lock().expect("residents lock") = backend.residents();

    while let Ok(Command::Run(job)) = commands.recv() {
        let id = job.id.clone();
        let response = catch_unwind(AssertUnwindSafe(|| execute(&mut backend, job, &outbox)))
            .unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!("the engine panicked: {what}");
                Response::err(
                    Some(id.clone()),
                    ResponseError::internal(format!("the engine panicked: {what}")),
                )
            });
        outbox.send(response);
        *residents.lock().expect("residents lock") = backend.residents();
        let _ = events.send(ExecutorEvent::Done(id));
    }
    tracing::debug!("freeing the engine");
    backend.free();
}

/// Without an engine every job fails with the reason it could not start.
fn fail_all<C>(
    reason: String,
    commands: std_mpsc::Receiver<Command<C>>,
    outbox: Outbox,
    events: mpsc::UnboundedSender<ExecutorEvent>,
) {
    tracing::error!("the engine could not start: {reason}");
    let _ = events.send(ExecutorEvent::Failed(reason.clone()));
    while let Ok(Command::Run(job)) = commands.recv() {
        outbox.send(Response::err(
            Some(job.id.clone()),
            ResponseError::internal(format!("the engine could not start: {reason}")),
        ));
        let _ = events.send(ExecutorEvent::Done(job.id));
    }
}

fn execute<B: Backend>(backend: &mut B, job: Job<B::Cancel>, outbox: &Outbox) -> Response {
    let id = job.id;
    let result = match job.work {
        Work::Load(params) => {
            let mut progress = |stage, done, total, message| {
                outbox.send(Notification::new(
                    LoadProgressNotification::NAME,
                    LoadProgress {
                        request_id: id.clone(),
                        stage,
                        done,
                        total,
                        message,
                    },
                ));
            };
            backend
                .load(&params, &job.cancel, &mut progress)
                .map(to_value)
        }
        Work::Generate(params) => {
            let mut index = 0;
            let mut on_delta = |text: String, tokens| {
                outbox.send(Notification::new(
                    GenerateDeltaNotification::NAME,
                    GenerateDelta {
                        request_id: id.clone(),
                        index,
                        text,
                        tokens,
                    },
                ));
                index += 1;
            };
            backend
                .generate(&params, &job.cancel, &mut on_delta)
                .map(to_value)
        }
        Work::Unload(params) => backend.unload(&params).map(to_value),
        Work::Reset => backend.reset().map(to_value),
    };
    match result {
        Ok(value) => Response::ok(id, value),
        Err(error) => Response::err(Some(id), error),
    }
}

fn to_value(result: impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(result).expect("results serialise")
}
