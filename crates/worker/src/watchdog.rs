//! Rank 0's watchdog over its group: a rank that stops answering (stopped, hung, cut off
//! without its sockets closing) leaves the MLX thread waiting in a collective that never
//! returns; MLX's transports have no timeout. While a request runs, the watchdog checks when the
//! ranks last answered each other (`Group::heard`: every decode step, prefill chunk and
//! request shares something); past the timeout it answers that request with an error, and from
//! then on every request for the engine is answered at once with the same error (the group
//! cannot be trusted again: restart it). `status`, `cancel` and `shutdown` keep working.
//!
//! Loads are not watched: a rank may download or read weights for far longer than any timeout
//! without a word to the others (a rank that dies meanwhile still fails the load at once).

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc, Mutex, OnceLock,
};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protocol::{RequestId, Response, ResponseError};
use tokio::sync::mpsc;

use crate::executor::ExecutorEvent;
use crate::transport::Outbox;

/// What the MLX thread, the watchdog and the dispatcher's handle share.
#[derive(Default)]
pub struct Stall {
    /// Why the group is broken, once it is.
    broken: OnceLock<String>,
    /// The request the MLX thread runs now, and whether the watchdog may answer it (not a
    /// load); taken by whichever answers it.
    running: Mutex<Option<(RequestId, bool)>>,
}

impl Stall {
    /// Why the group is broken, if it is: every engine request is answered with it.
    pub fn broken(&self) -> Option<&str> {
        self.broken.get().map(String::as_str)
    }

    /// The MLX thread starts a request; `watched`: the watchdog may answer it.
    pub fn start(&self, id: RequestId, watched: bool) {
        *self.running.lock().expect("stall lock") = Some((id, watched));
    }

    /// The MLX thread has finished its request: whether it is still its to answer (not when
    /// the watchdog answered it meanwhile).
    pub fn finish(&self) -> bool {
        self.running.lock().expect("stall lock").take().is_some()
    }
}

/// Starts the watchdog thread over `heard` (ms since the Unix epoch), for as long as the
/// process lives.
pub fn spawn(
    stall: Arc<Stall>,
    heard: Arc<AtomicU64>,
    timeout: Duration,
    outbox: Outbox,
    events: mpsc::UnboundedSender<ExecutorEvent>,
) {
    let watch = move || loop {
        std::thread::sleep(Duration::from_millis(200).min(timeout));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let silent = Duration::from_millis(now.saturating_sub(heard.load(Ordering::Acquire)));
        let mut running = stall.running.lock().expect("stall lock");
        if !running.as_ref().is_some_and(|(_, watched)| *watched) || silent < timeout {
            continue;
        }
        let reason = format!(
            "the group of ranks stopped answering: no word from the other ranks for {} s \
             (--group-timeout-secs); a rank has hung or lost its connection: restart the \
             worker's group",
            silent.as_secs()
        );
        tracing::error!("{reason}");
        let _ = stall.broken.set(reason.clone());
        let (id, _) = running.take().expect("checked above");
        outbox.send(Response::err(
            Some(id.clone()),
            ResponseError::internal(reason),
        ));
        let _ = events.send(ExecutorEvent::Done(id));
        return;
    };
    std::thread::Builder::new()
        .name("group-watchdog".into())
        .spawn(watch)
        .expect("spawn the group watchdog");
}
