//! The MLX thread: the one thread that touches the engine. It runs one job at a time, sends its
//! notifications and its response straight to stdout's outbox (so deltas always precede their
//! response), then tells the dispatcher it is free.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::{mpsc as std_mpsc, Arc};
use std::time::Duration;

use mlx_engine::{CancelToken, Group};
use protocol::methods::{
    CacheEvictParams, CacheForkParams, CacheListParams, CachePinParams, GenerateDeltaNotification,
    GenerateParams, LoadParams, LoadProgress, LoadProgressNotification, NotificationMethod,
    UnloadParams, WorkerState,
};
use protocol::{Notification, RequestId, Response, ResponseError};
use tokio::sync::{mpsc, oneshot};

use crate::convert;
use crate::generations;
use crate::group::{self, Shared};
use crate::residents::{Residents, SharedResidents};
use crate::transport::Outbox;
use crate::watchdog::{self, Stall};
use crate::worker_engine::{EngineInfo, Settings, WorkerEngine};

/// Work that must run on the MLX thread, in arrival order.
#[derive(Debug)]
pub enum Work {
    /// `load`.
    Load(Box<LoadParams>),
    /// `generate`.
    Generate(Box<GenerateParams>),
    /// `unload`.
    Unload(UnloadParams),
    /// `reset`; true: the prompt caches too.
    Reset { prompt_cache: bool },
    /// `cache_list`, `cache_pin`, `cache_fork`, `cache_evict`.
    Cache(CacheCall),
}

/// A call on a model's kept conversations.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum CacheCall {
    List(CacheListParams),
    Pin(CachePinParams),
    Fork(CacheForkParams),
    Evict(CacheEvictParams),
}

impl Work {
    /// What `status` says while this runs.
    pub fn state(&self) -> WorkerState {
        match self {
            Work::Load(_) => WorkerState::Loading,
            Work::Generate(_) => WorkerState::Generating,
            Work::Unload(_) | Work::Reset { .. } | Work::Cache(_) => WorkerState::Idle,
        }
    }
}

/// A request to run, with the token that cancels it.
pub struct Job {
    /// The request's id.
    pub id: RequestId,
    /// What to do.
    pub work: Work,
    /// Set by `cancel`; polled by the engine between prefill chunks and decode steps.
    pub cancel: CancelToken,
}

/// What the MLX thread tells the dispatcher.
pub enum ExecutorEvent {
    /// The engine is up.
    Ready(EngineInfo),
    /// The engine could not start; engine requests will fail with this.
    Failed(String),
    /// The job with this id has answered; the thread is free.
    Done(RequestId),
}

enum Command {
    Run(Job),
    Quit,
}

/// The jobs the dispatcher handed over, as the MLX thread takes them: in order, also between
/// the decode steps of a batch (which may let the first ones join).
pub(crate) struct Inbox {
    commands: std_mpsc::Receiver<Command>,
    waiting: VecDeque<Job>,
    quit: bool,
}

impl Inbox {
    fn new(commands: std_mpsc::Receiver<Command>) -> Self {
        Inbox {
            commands,
            waiting: VecDeque::new(),
            quit: false,
        }
    }

    /// The next job, waiting for one; `None` once told to quit and every job handed over has
    /// been taken (a cancelling stop has cancelled them: they answer at once).
    fn next(&mut self) -> Option<Job> {
        if let Some(job) = self.waiting.pop_front() {
            return Some(job);
        }
        if self.quit {
            return None;
        }
        match self.commands.recv() {
            Ok(Command::Run(job)) => Some(job),
            Ok(Command::Quit) | Err(_) => None,
        }
    }

    /// The oldest job handed over and not yet taken, without waiting.
    pub(crate) fn peek(&mut self) -> Option<&Job> {
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Run(job) => self.waiting.push_back(job),
                Command::Quit => self.quit = true,
            }
        }
        self.waiting.front()
    }

    /// Takes the job [`Self::peek`] showed.
    pub(crate) fn pop(&mut self) -> Option<Job> {
        self.waiting.pop_front()
    }
}

/// Where the MLX thread's answers go: stdout, the dispatcher, and the residents snapshot.
#[derive(Clone)]
pub(crate) struct Answers {
    pub outbox: Outbox,
    events: mpsc::UnboundedSender<ExecutorEvent>,
    residents: SharedResidents,
}

impl Answers {
    /// Sends the response of job `id` and tells the dispatcher it is done. `fresh`: the
    /// engine's residents as the job left them, published before the response goes out, so
    /// that a host that reads it and asks `status` or `tokenize` at once finds the models as
    /// the response left them.
    pub(crate) fn answer(&self, id: RequestId, response: Response, fresh: Option<Residents>) {
        {
            let mut residents = self.residents.lock().expect("residents lock");
            if let Some(fresh) = fresh {
                let finished = std::mem::take(&mut residents.finished);
                *residents = Residents { finished, ..fresh };
            }
            residents.answered(id.clone());
        }
        self.outbox.send(response);
        let _ = self.events.send(ExecutorEvent::Done(id));
    }

    /// Publishes the engine's residents as they are now.
    pub(crate) fn refresh(&self, fresh: Residents) {
        let mut residents = self.residents.lock().expect("residents lock");
        let finished = std::mem::take(&mut residents.finished);
        *residents = Residents { finished, ..fresh };
    }

    /// Publishes MLX's memory now (what a generation changes of the residents).
    pub(crate) fn refresh_memory(&self, memory: protocol::methods::MemoryInfo) {
        self.residents.lock().expect("residents lock").memory = memory;
    }
}

/// The dispatcher's handle on the MLX thread.
pub struct Executor {
    commands: std_mpsc::Sender<Command>,
    stopped: Option<oneshot::Receiver<()>>,
    /// Whether the group broke (`watchdog.rs`); then jobs are answered here.
    stall: Arc<Stall>,
    outbox: Outbox,
    events: mpsc::UnboundedSender<ExecutorEvent>,
}

impl Executor {
    /// Starts the MLX thread; the engine is created on it (MLX state is not `Send`).
    pub fn spawn(
        outbox: Outbox,
        events: mpsc::UnboundedSender<ExecutorEvent>,
        residents: SharedResidents,
        settings: Settings,
        max_batch: usize,
        group_timeout: Duration,
    ) -> Executor {
        let (commands, command_rx) = std_mpsc::channel();
        let (stopped_tx, stopped) = oneshot::channel();
        let stall = Arc::new(Stall::default());
        let thread = Thread {
            outbox: outbox.clone(),
            events: events.clone(),
            residents,
            stall: stall.clone(),
        };
        std::thread::Builder::new()
            .name("mlx".into())
            .spawn(move || {
                let inbox = Inbox::new(command_rx);
                run(inbox, thread, (settings, max_batch), group_timeout);
                let _ = stopped_tx.send(());
            })
            .expect("spawn the MLX thread");
        Executor {
            commands,
            stopped: Some(stopped),
            stall,
            outbox,
            events,
        }
    }

    /// Hands a job to the MLX thread; call only when it is free. Once the group is broken the
    /// job is answered here with why.
    pub fn run(&self, job: Job) {
        if let Some(reason) = self.stall.broken() {
            let error = ResponseError::internal(reason.to_owned());
            self.outbox.send(Response::err(Some(job.id.clone()), error));
            let _ = self.events.send(ExecutorEvent::Done(job.id));
            return;
        }
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

/// What the MLX thread answers through.
struct Thread {
    outbox: Outbox,
    events: mpsc::UnboundedSender<ExecutorEvent>,
    residents: SharedResidents,
    stall: Arc<Stall>,
}

fn run(
    mut inbox: Inbox,
    thread: Thread,
    (settings, max_batch): (Settings, usize),
    group_timeout: Duration,
) {
    let Thread {
        outbox,
        events,
        residents,
        stall,
    } = thread;
    // Rank 0 of a group joins it here: the group, like every MLX object, lives on this thread.
    let group = match Group::from_env() {
        Ok(group) => group,
        Err(reason) => return fail_all(reason, inbox.commands, outbox, events),
    };
    let start = AssertUnwindSafe(|| WorkerEngine::new(&settings, group));
    let mut engine = match catch_unwind(start) {
        Ok(engine) => engine,
        Err(panic) => {
            let reason = format!("MLX panicked while starting: {}", panic_message(&*panic));
            return fail_all(reason, inbox.commands, outbox, events);
        }
    };
    if let Some(g) = engine.group() {
        let (stall, heard, out, ev) = (stall.clone(), g.heard(), outbox.clone(), events.clone());
        watchdog::spawn(stall, heard, group_timeout, out, ev);
    }
    let _ = events.send(ExecutorEvent::Ready(engine.info()));
    *residents.lock().expect("residents lock") = engine.residents();
    let answers = Answers {
        outbox: outbox.clone(),
        events,
        residents,
    };

    while let Some(job) = inbox.next() {
        let id = job.id.clone();
        // In a group the ranks run one request in step, watched (`watchdog.rs`).
        let watched = match engine.group() {
            Some(g) => {
                stall.start(id.clone(), !matches!(job.work, Work::Load(_)));
                g.touch();
                if let Err(broken) = group::share(g, &Shared::of(&job.work)) {
                    if stall.finish() {
                        let error = ResponseError::internal(broken);
                        answers.answer(id.clone(), Response::err(Some(id), error), None);
                    }
                    continue;
                }
                Some(stall.clone())
            }
            None => None,
        };
        // Generations admitted and not yet answered: answered here should the engine panic.
        let open = Rc::new(RefCell::new(Vec::new()));
        let generation = matches!(job.work, Work::Generate(_));
        let run = AssertUnwindSafe(|| match job.work {
            // Every generation is an admission to the engine's scheduler, joined by those that
            // can share its decode steps (at most `--max-batch`; one at a time in a group).
            Work::Generate(_) => {
                let limit = if watched.is_some() { 1 } else { max_batch };
                let on = generations::On {
                    answers: &answers,
                    open: &open,
                    watched: watched.clone(),
                };
                generations::run(&mut engine, job, &mut inbox, limit, on);
                None
            }
            _ => Some(execute(&mut engine, job, &outbox, &stall)),
        });
        let response = match catch_unwind(run) {
            Ok(response) => response,
            Err(panic) => {
                let what = panic_message(&*panic);
                tracing::error!("the engine panicked: {what}");
                let error = ResponseError::internal(format!("the engine panicked: {what}"));
                let open = open.take();
                if !open.is_empty() && (watched.is_none() || stall.finish()) {
                    for o in open {
                        answers.answer(o.clone(), Response::err(Some(o), error.clone()), None);
                    }
                }
                (!generation).then(|| Response::err(Some(id.clone()), error))
            }
        };
        match response {
            // The watchdog answered it when the group broke.
            Some(response) if watched.is_none() || stall.finish() => {
                answers.answer(id, response, Some(engine.residents()))
            }
            Some(_) => {}
            None => {
                // A watched generation nobody answered (its end never came): answered here, so
                // the watchdog does not find it running once the thread is idle.
                if watched.is_some() && stall.finish() {
                    let error = ResponseError::internal("the generation ended without an answer");
                    answers.answer(id.clone(), Response::err(Some(id), error), None);
                }
                answers.refresh(engine.residents())
            }
        }
    }
    tracing::debug!("freeing the engine");
    if let Some(g) = engine.group() {
        let _ = group::share(g, &Shared::Quit);
    }
    engine.free();
}

/// The text a panic was raised with, when it has one.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// Without an engine every job fails with the reason it could not start.
fn fail_all(
    reason: String,
    commands: std_mpsc::Receiver<Command>,
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

/// Runs `job`; its notifications stop once the watchdog has answered it (`stall`).
fn execute(engine: &mut WorkerEngine, job: Job, outbox: &Outbox, stall: &Stall) -> Response {
    let id = job.id;
    let quiet = || stall.broken().is_some();
    let result = match job.work {
        Work::Load(params) => {
            let cancelled = || job.cancel.is_cancelled();
            let mut progress = |stage, done, total, message| {
                if quiet() {
                    return;
                }
                outbox.send_paced(
                    Notification::new(
                        LoadProgressNotification::NAME,
                        LoadProgress {
                            request_id: id.clone(),
                            stage,
                            done,
                            total,
                            message,
                        },
                    ),
                    &cancelled,
                );
            };
            engine
                .load(&params, &job.cancel, &mut progress)
                .map(to_value)
        }
        Work::Generate(_) => unreachable!("generations run through `generations::run`"),
        Work::Unload(params) => engine.unload(&params).map(to_value),
        Work::Reset { prompt_cache } => Ok(to_value(engine.reset(prompt_cache))),
        Work::Cache(call) => engine.cache(call),
    };
    match result {
        Ok(value) => Response::ok(id, value),
        Err(error) => Response::err(Some(id), error),
    }
}

/// Sends a generation's deltas as notifications, counted from 0; paced by the host's reading
/// (until the request is cancelled).
pub(crate) fn delta_sender(
    id: RequestId,
    cancel: CancelToken,
    outbox: Outbox,
) -> impl FnMut(mlx_engine::Delta) {
    let mut index = 0;
    move |d| {
        let delta = convert::generate_delta(id.clone(), index, d);
        let notification = Notification::new(GenerateDeltaNotification::NAME, delta);
        outbox.send_paced(notification, &|| cancel.is_cancelled());
        index += 1;
    }
}

pub(crate) fn to_value(result: impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(result).expect("results serialise")
}
