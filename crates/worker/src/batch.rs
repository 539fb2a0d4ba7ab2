//! Continuous batching on the MLX thread (`--max-batch`): generate jobs become admissions of
//! the engine's batch ([`mlx_engine::Engine::generate_batch`]); the jobs the dispatcher hands
//! over while it runs join between decode steps when they can share its passes, else wait
//! (with everything behind them) until it has ended.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;

use mlx_engine::{Admission, Completion, EngineError, GenerateRequest};
use protocol::{RequestId, Response, ResponseError};

use crate::convert;
use crate::engine_adapter::EngineAdapter;
use crate::errors::engine_error;
use crate::executor::{delta_sender, panic_message, to_value, Answers, Inbox, Job, Work};

/// Runs the generate job `first` and those that join it, answering each.
pub(crate) fn run(
    engine: &mut EngineAdapter,
    first: Job,
    inbox: &mut Inbox,
    max_batch: usize,
    answers: &Answers,
) {
    // Admitted and not yet answered: answered here should the engine panic.
    let open = Rc::new(RefCell::new(Vec::new()));
    let Some(first) = admission(first, answers, &open) else {
        return;
    };
    let mut more = |fits: &dyn Fn(&GenerateRequest) -> bool| loop {
        let Work::Generate(params) = &inbox.peek()?.work else {
            return None;
        };
        match convert::generate_request(params) {
            Ok(req) if fits(&req) => {
                let job = inbox.pop()?;
                return Some(admit(job, req, answers, &open));
            }
            Ok(_) => return None,
            // A request the engine would refuse anyway is answered now, and the next one looked at.
            Err(error) => {
                let job = inbox.pop()?;
                answers.answer(job.id.clone(), Response::err(Some(job.id), error), None);
            }
        }
    };
    let batch = AssertUnwindSafe(|| engine.generate_batch(first, max_batch, &mut more));
    if let Err(panic) = catch_unwind(batch) {
        let what = panic_message(&*panic);
        tracing::error!("the engine panicked in a batch: {what}");
        let error = ResponseError::internal(format!("the engine panicked: {what}"));
        for id in open.take() {
            answers.answer(id.clone(), Response::err(Some(id), error.clone()), None);
        }
    }
}

/// `job` as an admission; `None` when its params were refused (and answered).
fn admission(
    job: Job,
    answers: &Answers,
    open: &Rc<RefCell<Vec<RequestId>>>,
) -> Option<Admission<'static>> {
    let Work::Generate(params) = &job.work else {
        unreachable!("only generate jobs are batched")
    };
    match convert::generate_request(params) {
        Ok(req) => Some(admit(job, req, answers, open)),
        Err(error) => {
            answers.answer(job.id.clone(), Response::err(Some(job.id), error), None);
            None
        }
    }
}

/// The admission of `job` (its request `req`): deltas to stdout as they come, the response
/// when the engine is done with it.
fn admit(
    job: Job,
    req: GenerateRequest,
    answers: &Answers,
    open: &Rc<RefCell<Vec<RequestId>>>,
) -> Admission<'static> {
    let id = job.id;
    open.borrow_mut().push(id.clone());
    let on_delta = delta_sender(id.clone(), job.cancel.clone(), answers.outbox.clone());
    let (answers, open) = (answers.clone(), open.clone());
    let on_done = move |result: Result<Completion, EngineError>| {
        open.borrow_mut().retain(|o| o != &id);
        let response = match result {
            Ok(c) => Response::ok(id.clone(), to_value(convert::generate_result(c))),
            Err(e) => Response::err(Some(id.clone()), engine_error(e)),
        };
        answers.answer(id, response, None);
    };
    Admission {
        req,
        cancel: job.cancel,
        on_delta: Box::new(on_delta),
        on_done: Box::new(on_done),
    }
}
