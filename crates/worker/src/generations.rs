//! Generate jobs on the MLX thread: each one an admission to the engine's scheduler
//! ([`mlx_engine::Engine::generate_batch`]); a lone one is a batch of one. The jobs the
//! dispatcher hands over while it runs join between decode steps when they can share its passes
//! (`--max-batch`), else wait (with everything behind them) until it has ended.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use mlx_engine::{Admission, Completion, EngineError, GenerateRequest};
use protocol::{RequestId, Response};

use crate::convert;
use crate::errors::engine_error;
use crate::executor::{delta_sender, to_value, Answers, Inbox, Job, Work};
use crate::watchdog::Stall;
use crate::worker_engine::WorkerEngine;

/// Where a batch's answers go.
pub(crate) struct On<'a> {
    pub answers: &'a Answers,
    /// Admitted and not yet answered (the executor answers them should the engine panic).
    pub open: &'a Rc<RefCell<Vec<RequestId>>>,
    /// In a group: the watchdog's view of the one request running; once it has answered it
    /// (the group broke), nothing more is sent for it.
    pub watched: Option<Arc<Stall>>,
}

/// Runs the generate job `first` and those that join it (at most `max_batch` at a time),
/// answering each.
pub(crate) fn run(
    engine: &mut WorkerEngine,
    first: Job,
    inbox: &mut Inbox,
    max_batch: usize,
    on: On,
) {
    let Some(first) = admission(first, &on) else {
        return;
    };
    let mut more = |fits: &dyn Fn(&GenerateRequest) -> bool| loop {
        let Work::Generate(params) = &inbox.peek()?.work else {
            return None;
        };
        match convert::generate_request(params) {
            Ok(req) if fits(&req) => {
                let job = inbox.pop()?;
                return Some(admit(job, req, &on));
            }
            Ok(_) => return None,
            // A request the engine would refuse anyway is answered now, and the next one looked at.
            Err(error) => {
                let job = inbox.pop()?;
                on.answers
                    .answer(job.id.clone(), Response::err(Some(job.id), error), None);
            }
        }
    };
    engine
        .engine_mut()
        .generate_batch(first, max_batch, &mut more);
}

/// `job` as an admission; `None` when its params were refused (and answered).
fn admission(job: Job, on: &On) -> Option<Admission<'static>> {
    let Work::Generate(params) = &job.work else {
        unreachable!("only generate jobs are admitted")
    };
    match convert::generate_request(params) {
        Ok(req) => Some(admit(job, req, on)),
        Err(error) => {
            let answer = on.watched.as_deref().is_none_or(Stall::finish);
            if answer {
                (on.answers).answer(job.id.clone(), Response::err(Some(job.id), error), None);
            }
            None
        }
    }
}

/// The admission of `job` (its request `req`): deltas to stdout as they come, the response
/// (with MLX's memory as the generation left it) when the engine is done with it.
fn admit(job: Job, req: GenerateRequest, on: &On) -> Admission<'static> {
    let id = job.id;
    on.open.borrow_mut().push(id.clone());
    let mut send = delta_sender(id.clone(), job.cancel.clone(), on.answers.outbox.clone());
    let (answers, open) = (on.answers.clone(), on.open.clone());
    let (watched, quiet) = (on.watched.clone(), on.watched.clone());
    let on_delta = move |d| {
        if quiet.as_ref().is_none_or(|s| s.broken().is_none()) {
            send(d)
        }
    };
    let on_done = move |result: Result<Completion, EngineError>| {
        if watched.as_deref().is_none_or(Stall::finish) {
            let response = match result {
                Ok(c) => Response::ok(id.clone(), to_value(convert::generate_result(c))),
                Err(e) => Response::err(Some(id.clone()), engine_error(e)),
            };
            answers.refresh_memory(convert::memory(mlx_engine::memory_stats()));
            answers.answer(id.clone(), response, None);
        }
        // Only once answered: a panic before this leaves it to the executor to answer.
        open.borrow_mut().retain(|o| o != &id);
    };
    Admission {
        req,
        cancel: job.cancel,
        on_delta: Box::new(on_delta),
        on_done: Box::new(on_done),
    }
}
