//! The dispatcher: one task that owns the queue and the lifecycle.
//!
//! `initialize`, `status`, `cancel`, `tokenize` and `shutdown` are answered here at once, even
//! while the MLX thread generates. `load`, `generate`, `unload` and `reset` have their params
//! checked here, then wait in the bounded queue and run one at a time on the MLX thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx_engine::CancelToken;

use protocol::methods::{
    CacheEvict, CacheFork, CacheList, CachePin, Cancel, CancelRequestNotification,
    CancelRequestParams, CancelResult, CancelledNotification, CancelledParams, Capabilities,
    FinishReason, Generate, GenerateResult, Initialize, InitializeResult, Load, Method,
    NotificationMethod, ProgramInfo, QueueInfo, Reset, Shutdown, ShutdownResult, Status,
    StatusResult, Timings, Tokenize, TokenizeParams, Unload, Usage, WorkerState, PROTOCOL_VERSION,
};
use protocol::{ErrorCode, Message, Notification, Request, RequestId, Response, ResponseError};
use serde_json::Value;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::executor::{CacheCall, Executor, ExecutorEvent, Job, Work};
use crate::queue::JobQueue;
use crate::residents::{self, SharedResidents};
use crate::transport::{Inbound, Outbox};
use crate::worker_engine::EngineInfo;

/// How long a cancelling stop waits for the running job to notice its cancellation. With the
/// parent poll, the MLX thread's release and the last flush, the exit stays within a second.
const CANCEL_GRACE: Duration = Duration::from_millis(450);
/// How often the dispatcher looks whether its parent process is still there.
const PARENT_POLL: Duration = Duration::from_millis(100);
/// How long a stop then waits for the MLX thread to free memory.
const FREE_GRACE: Duration = Duration::from_millis(200);
/// How long, with the prompt cache's disk tier on, for it to write the kept conversations too
/// (a gigabyte of caches takes seconds).
const WRITE_GRACE: Duration = Duration::from_secs(60);
/// How long rank 0 of a group waits, on a graceful stop, for the other ranks to take its quit.
const GROUP_QUIT_GRACE: Duration = Duration::from_secs(10);

struct Running {
    id: RequestId,
    state: WorkerState,
    cancel: CancelToken,
}

/// Why the worker stops (protocol.md, "Lifecycle").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    /// `shutdown`: what was received before it runs first.
    Shutdown,
    /// End of stdin: no more requests; what was received runs first.
    EndOfInput,
    Sigterm,
    Sigint,
    /// stdout closed or the parent process died: nobody reads the answers.
    HostGone,
}

impl StopReason {
    /// Whether the work already received still runs (else it is cancelled).
    fn drains(self) -> bool {
        matches!(self, StopReason::Shutdown | StopReason::EndOfInput)
    }
}

/// The dispatcher's state.
pub struct Dispatcher {
    outbox: Outbox,
    executor: Executor,
    queue: JobQueue,
    /// Started, in start order: one job, or with `--max-batch` several generations.
    running: Vec<Running>,
    max_queue: usize,
    max_batch: usize,
    info: Option<EngineInfo>,
    engine_failed: Option<String>,
    waiting_initialize: Vec<RequestId>,
    residents: SharedResidents,
    started: Instant,
    served: u64,
    stopping: Option<StopReason>,
    /// `shutdown` requests, answered once the work before them is done.
    shutdowns: Vec<RequestId>,
    /// `tokenize` requests being answered off the dispatcher (a stop waits for them).
    tokenizing: Arc<AtomicUsize>,
    /// Signalled when one of those is answered.
    tokenized: Arc<Notify>,
}

impl Dispatcher {
    /// A dispatcher in front of `executor`.
    pub fn new(
        outbox: Outbox,
        executor: Executor,
        residents: SharedResidents,
        max_queue: usize,
        max_batch: usize,
    ) -> Self {
        Dispatcher {
            outbox,
            executor,
            queue: JobQueue::new(max_queue),
            running: Vec::new(),
            max_queue,
            max_batch,
            info: None,
            engine_failed: None,
            waiting_initialize: Vec::new(),
            residents,
            started: Instant::now(),
            served: 0,
            stopping: None,
            shutdowns: Vec::new(),
            tokenizing: Arc::default(),
            tokenized: Arc::default(),
        }
    }

    /// Serves until `shutdown` or end of stdin (after finishing what was received), or until
    /// SIGTERM, SIGINT or the host going away (cancelling everything, within about a second);
    /// then frees MLX memory and returns.
    pub async fn run(
        mut self,
        mut inbound: mpsc::UnboundedReceiver<Inbound>,
        mut events: mpsc::UnboundedReceiver<ExecutorEvent>,
        mut stdout_gone: oneshot::Receiver<()>,
    ) {
        let mut sigterm = signal(SignalKind::terminate()).expect("install a SIGTERM handler");
        let mut sigint = signal(SignalKind::interrupt()).expect("install a SIGINT handler");
        let parent = std::os::unix::process::parent_id();
        let mut parent_poll = tokio::time::interval(PARENT_POLL);
        let (mut input_open, mut stdout_open) = (true, true);
        let mut deadline = None;
        let tokenized = self.tokenized.clone();

        loop {
            tokio::select! {
                item = inbound.recv(), if input_open => match item {
                    Some(Inbound::Message(message)) => self.handle(message),
                    Some(Inbound::Closed) | None => {
                        input_open = false;
                        self.stop(StopReason::EndOfInput);
                    }
                },
                event = events.recv() => match event {
                    Some(event) => self.on_event(event),
                    None => {
                        tracing::error!("the MLX thread is gone; exiting");
                        break;
                    }
                },
                // A `tokenize` was answered: look again whether a stop may end.
                _ = tokenized.notified() => {}
                _ = sigterm.recv() => self.stop(StopReason::Sigterm),
                _ = sigint.recv() => self.stop(StopReason::Sigint),
                _ = &mut stdout_gone, if stdout_open => {
                    stdout_open = false;
                    self.stop(StopReason::HostGone);
                }
                // Orphans are re-parented (to init or a subreaper): the parent is gone. Polled,
                // so that it works alike on Linux and macOS.
                _ = parent_poll.tick() => {
                    if std::os::unix::process::parent_id() != parent {
                        self.stop(StopReason::HostGone);
                    }
                }
                _ = sleep_until(deadline) => {
                    tracing::warn!("the running job did not stop in time; exiting anyway");
                    break;
                }
            }
            if let Some(reason) = self.stopping {
                if !reason.drains() {
                    deadline.get_or_insert_with(|| tokio::time::Instant::now() + CANCEL_GRACE);
                }
                if self.idle() {
                    break;
                }
            }
        }

        for id in std::mem::take(&mut self.shutdowns) {
            self.reply::<Shutdown>(id, ShutdownResult {});
        }
        // Rank 0 of a group stopping gracefully tells the other ranks to stop, which waits for
        // them to be listening (a rank may still be starting).
        let in_group = self.info.as_ref().is_some_and(|i| i.group.is_some());
        let writes = self.info.as_ref().is_some_and(|i| i.writes_at_exit);
        let grace = match self.stopping.is_some_and(StopReason::drains) && in_group {
            true => GROUP_QUIT_GRACE,
            false if writes => WRITE_GRACE,
            false => FREE_GRACE,
        };
        if !self.executor.quit(grace).await {
            tracing::warn!("the MLX thread did not free in time; exiting anyway");
        }
        let _ = tokio::time::timeout(FREE_GRACE, self.outbox.flush()).await;
        tracing::info!(reason = ?self.stopping, served = self.served, "stopped");
    }

    /// Nothing received is left unanswered: no job running or queued, no `initialize` waiting
    /// for the engine, no `tokenize` in flight.
    fn idle(&self) -> bool {
        self.running.is_empty()
            && self.queue.is_empty()
            && self.waiting_initialize.is_empty()
            && self.tokenizing.load(Ordering::SeqCst) == 0
    }

    fn handle(&mut self, message: Message) {
        match message {
            Message::Request(request) => {
                // While stopping, `status`, `cancel` and the other answers-at-once still work;
                // new work is refused.
                let new_work = [
                    Load::NAME,
                    Generate::NAME,
                    Unload::NAME,
                    Reset::NAME,
                    CacheList::NAME,
                    CachePin::NAME,
                    CacheFork::NAME,
                    CacheEvict::NAME,
                ]
                .contains(&request.method.as_str());
                if self.stopping.is_some() && new_work {
                    let error = ResponseError::new(
                        ErrorCode::InvalidRequest,
                        "the worker is shutting down and takes no more work; start a new one",
                    );
                    self.answer(Response::err(Some(request.id), error));
                } else {
                    self.on_request(request);
                }
            }
            Message::Notification(notification) => self.on_notification(notification),
            Message::Response(response) => {
                tracing::debug!(id = ?response.id, "ignoring a response: the worker sends no requests")
            }
        }
    }

    fn on_request(&mut self, request: Request) {
        let Request { id, method, params } = request;
        tracing::debug!(%id, %method, "request");
        self.route(id, &method, &params);
    }

    /// Decodes and checks `params` as `M`'s, then hands them to `M`'s handler; a bad param is
    /// answered here.
    fn call<M: Handler>(&mut self, id: RequestId, params: &Value) {
        match M::parse_params(params) {
            Ok(params) => M::handle(self, id, params),
            Err(e) => self.answer(Response::err(Some(id), e)),
        }
    }

    /// Answers `id` with `M`'s result type.
    fn reply<M: Method>(&mut self, id: RequestId, result: M::Result) {
        self.answer(Response::ok(id, result));
    }

    fn on_notification(&mut self, notification: Notification) {
        let target = match notification.method.as_str() {
            CancelRequestNotification::NAME => notification
                .parse_params::<CancelRequestParams>()
                .map(|p| p.id),
            CancelledNotification::NAME => notification
                .parse_params::<CancelledParams>()
                .map(|p| p.request_id),
            other => {
                tracing::debug!(method = other, "ignoring an unknown notification");
                return;
            }
        };
        match target {
            Ok(id) => {
                let cancelled = self.cancel(&id);
                tracing::debug!(%id, cancelled, "cancel notification");
            }
            Err(e) => {
                tracing::warn!(method = %notification.method, "ignoring a notification: {}", e.message)
            }
        }
    }

    fn enqueue(&mut self, id: RequestId, work: Work) {
        let job = Job {
            id,
            work,
            cancel: CancelToken::new(),
        };
        if self.running.is_empty() && self.queue.is_empty() {
            return self.start(job);
        }
        if let Err(job) = self.queue.push(job) {
            let max_queue = self.max_queue;
            self.answer(Response::err(Some(job.id), ResponseError::busy(max_queue)));
        }
        self.join();
    }

    fn start(&mut self, job: Job) {
        self.running.push(Running {
            id: job.id.clone(),
            state: job.work.state(),
            cancel: job.cancel.clone(),
        });
        self.executor.run(job);
    }

    /// With `--max-batch`: hands the MLX thread the generate requests at the head of the queue
    /// while generations run and the batch has room; the MLX thread lets each join between two
    /// decode steps, or holds it (and what follows) until the batch has ended when it cannot
    /// share their passes (protocol.md, Transport).
    fn join(&mut self) {
        let generating = |r: &Running| r.state == WorkerState::Generating;
        while !self.running.is_empty()
            && self.running.len() < self.max_batch
            && self.running.iter().all(generating)
            && self.stopping.is_none_or(StopReason::drains)
            && self.queue.front_is_generate()
        {
            let job = self.queue.pop().expect("a job at the front");
            self.start(job);
        }
    }

    fn on_event(&mut self, event: ExecutorEvent) {
        match event {
            ExecutorEvent::Ready(info) => {
                self.info = Some(info);
                self.answer_initialize();
            }
            ExecutorEvent::Failed(reason) => {
                self.engine_failed = Some(reason);
                self.answer_initialize();
            }
            ExecutorEvent::Done(id) => {
                // The MLX thread wrote the response itself.
                self.served += 1;
                self.running.retain(|r| r.id != id);
                self.residents
                    .lock()
                    .expect("residents lock")
                    .finished
                    .retain(|f| f != &id);
                if self.running.is_empty() && self.stopping.is_none_or(StopReason::drains) {
                    if let Some(next) = self.queue.pop() {
                        self.start(next);
                    }
                }
                self.join();
            }
        }
    }

    /// Cancels a queued or running request; whether there was one.
    fn cancel(&mut self, id: &RequestId) -> bool {
        if let Some(running) = self.running.iter().find(|r| &r.id == id) {
            running.cancel.cancel();
            return true;
        }
        match self.queue.remove(id) {
            Some(job) => {
                self.answer_cancelled(job);
                true
            }
            None => false,
        }
    }

    /// The answer of a job cancelled before it ran.
    fn answer_cancelled(&mut self, job: Job) {
        let response = match job.work {
            Work::Generate(_) => Response::ok(
                job.id,
                GenerateResult {
                    text: String::new(),
                    finish_reason: FinishReason::Cancelled,
                    usage: Usage::default(),
                    timings: Timings::default(),
                    tool_calls: Vec::new(),
                },
            ),
            _ => Response::err(Some(job.id), ResponseError::request_cancelled()),
        };
        self.answer(response);
    }

    /// Stops taking work; a draining stop lets what was received run, any other cancels it (and
    /// overrides a drain in progress).
    fn stop(&mut self, reason: StopReason) {
        match self.stopping {
            Some(current) if !current.drains() || reason.drains() => return,
            _ => {}
        }
        self.stopping = Some(reason);
        if reason.drains() {
            tracing::info!(
                ?reason,
                queued = self.queue.len(),
                "stopping after the work received"
            );
            return;
        }
        tracing::info!(?reason, "stopping: cancelling running and queued work");
        for running in &self.running {
            running.cancel.cancel();
        }
        for job in self.queue.drain() {
            self.answer_cancelled(job);
        }
    }

    fn answer_initialize(&mut self) {
        let info = match (&self.info, &self.engine_failed) {
            (Some(info), _) => info.clone(),
            (None, Some(reason)) => {
                let error =
                    ResponseError::internal(format!("the engine could not start: {reason}"));
                for id in std::mem::take(&mut self.waiting_initialize) {
                    self.answer(Response::err(Some(id), error.clone()));
                }
                return;
            }
            // Answered when the MLX thread reports in.
            (None, None) => return,
        };
        for id in std::mem::take(&mut self.waiting_initialize) {
            let result = InitializeResult {
                protocol_version: PROTOCOL_VERSION.into(),
                worker: ProgramInfo {
                    name: env!("CARGO_PKG_NAME").into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                },
                mlx: info.mlx.clone(),
                capabilities: Capabilities {
                    architectures: info.architectures.clone(),
                    vision: info.vision,
                    lora: info.lora,
                    gguf: info.gguf,
                    max_queue: self.max_queue,
                    max_batch: self.max_batch,
                    batch_attention: info.batch_attention,
                },
                group: info.group.clone(),
            };
            self.answer(Response::ok(id, result));
        }
    }

    fn status(&self) -> StatusResult {
        let residents = self.residents.lock().expect("residents lock");
        let running: Vec<&Running> = (self.running.iter())
            .filter(|r| !residents.has_answered(&r.id))
            .collect();
        StatusResult {
            state: running.first().map_or(WorkerState::Idle, |r| r.state),
            active_model: residents.active_model.clone(),
            models: residents.models.clone(),
            queue: QueueInfo {
                running: running.len() as u32,
                waiting: self.queue.len() as u32,
            },
            memory: residents.memory.clone(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            requests_served: self.served,
            prompt_cache: residents.prompt_cache.clone(),
            group: self.info.as_ref().and_then(|i| i.group.clone()),
        }
    }

    /// Tokenizes with the resident model's tokenizer, off the dispatcher (templating can take a
    /// while) and off the MLX thread (which may be generating).
    fn tokenize(&mut self, id: RequestId, params: TokenizeParams) {
        if let Some(reason) = &self.engine_failed {
            let error = ResponseError::internal(format!("the engine could not start: {reason}"));
            return self.answer(Response::err(Some(id), error));
        }
        let tokenizer = self
            .residents
            .lock()
            .expect("residents lock")
            .tokenizer(params.model.as_deref());
        let tokenizer = match tokenizer {
            Ok(t) => t,
            Err(e) => return self.answer(Response::err(Some(id), e)),
        };
        self.served += 1;
        let outbox = self.outbox.clone();
        let (tokenizing, tokenized) = (self.tokenizing.clone(), self.tokenized.clone());
        tokenizing.fetch_add(1, Ordering::SeqCst);
        tokio::task::spawn_blocking(move || {
            let response = match residents::tokenize(&tokenizer, &params) {
                Ok(result) => Response::ok(id, result),
                Err(e) => Response::err(Some(id), e),
            };
            outbox.send(response);
            tokenizing.fetch_sub(1, Ordering::SeqCst);
            tokenized.notify_one();
        });
    }

    fn answer(&mut self, response: Response) {
        self.served += 1;
        self.outbox.send(response);
    }
}

/// What the dispatcher does with a request to one method once its params are decoded and
/// checked: answer it at once, or queue it for the MLX thread.
trait Handler: Method {
    fn handle(d: &mut Dispatcher, id: RequestId, params: Self::Params);
}

/// `Dispatcher::route`, generated from the protocol's one list of methods
/// ([`protocol::for_each_method!`]): a method there without a [`Handler`] does not compile.
macro_rules! router {
    ($($m:ty),*) => {
        impl Dispatcher {
            /// Runs a request to `method` through its handler; an unknown method is answered
            /// `method not found`.
            fn route(&mut self, id: RequestId, method: &str, params: &Value) {
                match method {
                    $(<$m as Method>::NAME => self.call::<$m>(id, params),)*
                    other => {
                        let error = ResponseError::method_not_found(other);
                        self.answer(Response::err(Some(id), error))
                    }
                }
            }
        }
    };
}
protocol::for_each_method!(router);

impl Handler for Initialize {
    fn handle(d: &mut Dispatcher, id: RequestId, params: Self::Params) {
        if let Some(version) = params.protocol_version.filter(|v| v != PROTOCOL_VERSION) {
            tracing::warn!(
                %version,
                "host speaks another protocol version; answering with {PROTOCOL_VERSION}"
            );
        }
        d.waiting_initialize.push(id);
        d.answer_initialize();
    }
}

impl Handler for Status {
    fn handle(d: &mut Dispatcher, id: RequestId, _: Self::Params) {
        let status = d.status();
        d.reply::<Self>(id, status);
    }
}

impl Handler for Cancel {
    fn handle(d: &mut Dispatcher, id: RequestId, params: Self::Params) {
        let cancelled = d.cancel(&params.request_id);
        d.reply::<Self>(id, CancelResult { cancelled });
    }
}

impl Handler for Tokenize {
    fn handle(d: &mut Dispatcher, id: RequestId, params: Self::Params) {
        d.tokenize(id, params);
    }
}

impl Handler for Shutdown {
    /// Answered once the work received before it is done (see [`Dispatcher::run`]).
    fn handle(d: &mut Dispatcher, id: RequestId, _: Self::Params) {
        d.shutdowns.push(id);
        d.stop(StopReason::Shutdown);
    }
}

impl Handler for Load {
    fn handle(d: &mut Dispatcher, id: RequestId, params: Self::Params) {
        if params.trust_remote_code {
            tracing::warn!("trust_remote_code is accepted but no remote code ever runs");
        }
        d.enqueue(id, Work::Load(Box::new(params)));
    }
}

impl Handler for Generate {
    fn handle(d: &mut Dispatcher, id: RequestId, params: Self::Params) {
        d.enqueue(id, Work::Generate(Box::new(params)));
    }
}

impl Handler for Unload {
    fn handle(d: &mut Dispatcher, id: RequestId, params: Self::Params) {
        d.enqueue(id, Work::Unload(params));
    }
}

impl Handler for CacheList {
    fn handle(d: &mut Dispatcher, id: RequestId, params: Self::Params) {
        d.enqueue(id, Work::Cache(CacheCall::List(params)));
    }
}

impl Handler for CachePin {
    fn handle(d: &mut Dispatcher, id: RequestId, params: Self::Params) {
        d.enqueue(id, Work::Cache(CacheCall::Pin(params)));
    }
}

impl Handler for CacheFork {
    fn handle(d: &mut Dispatcher, id: RequestId, params: Self::Params) {
        d.enqueue(id, Work::Cache(CacheCall::Fork(params)));
    }
}

impl Handler for CacheEvict {
    fn handle(d: &mut Dispatcher, id: RequestId, params: Self::Params) {
        d.enqueue(id, Work::Cache(CacheCall::Evict(params)));
    }
}

impl Handler for Reset {
    fn handle(d: &mut Dispatcher, id: RequestId, params: Self::Params) {
        d.enqueue(
            id,
            Work::Reset {
                prompt_cache: params.prompt_cache,
            },
        );
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
