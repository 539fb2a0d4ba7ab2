//! The run: sends chunks of lines, matches every answer to what the oracle expects.

use super::*;

pub(super) struct Pending {
    pub(super) method: Option<String>,
    pub(super) line: String,
}

pub(super) struct Run {
    pub(super) seed: u64,
    pub(super) client: Client,
    /// Answers still owed, by id (a multiset: ids may be reused).
    pub(super) pending: HashMap<RequestId, Vec<Pending>>,
    /// Answers to reused ids, held until every request with that id has its answer.
    pub(super) answered: HashMap<RequestId, Vec<Response>>,
    /// Codes of id-null errors still owed.
    pub(super) null_errors: Vec<i64>,
    /// How many requests carried each id, over the whole run.
    pub(super) sent: HashMap<RequestId, usize>,
    pub(super) load_ids: HashSet<RequestId>,
    pub(super) generate_ids: HashSet<RequestId>,
    pub(super) deltas: HashMap<RequestId, Vec<GenerateDelta>>,
    /// The lines of the last two chunks, for failure reports.
    pub(super) recent_lines: Vec<String>,
    pub(super) chunk: usize,
    pub(super) requests: usize,
    pub(super) responses: usize,
    pub(super) generations_checked: usize,
    pub(super) errors_by_code: HashMap<i64, usize>,
    /// (method, error code or 0 for a result) -> count, for the summary.
    pub(super) outcomes: HashMap<(String, i64), usize>,
}

impl Run {
    pub(super) fn fail(&self, what: String) -> ! {
        let lines: Vec<&str> = self.recent_lines.iter().map(|l| l.as_str()).collect();
        panic!(
            "worker fuzz failed (FUZZ_SEED={:#x}, chunk {}): {what}\nrecent lines:\n{}\nstderr tail:\n{}",
            self.seed,
            self.chunk,
            lines.join("\n"),
            tail(&self.client.stderr_tail(), 4000)
        );
    }

    pub(super) fn expect_line(&mut self, line: &[u8]) {
        let shown = String::from_utf8_lossy(&line[..line.len().min(400)]).into_owned();
        self.recent_lines.push(shown.clone());
        match expect(line) {
            Expect::Nothing => {}
            Expect::NullError(code) => self.null_errors.push(code),
            Expect::Answer(id, method) => {
                self.requests += 1;
                *self.sent.entry(id.clone()).or_default() += 1;
                match method.as_deref() {
                    Some(Load::NAME) => {
                        self.load_ids.insert(id.clone());
                    }
                    Some(Generate::NAME) => {
                        self.generate_ids.insert(id.clone());
                    }
                    _ => {}
                }
                self.pending.entry(id).or_default().push(Pending {
                    method,
                    line: shown,
                });
            }
        }
    }

    pub(super) fn outstanding(&self) -> usize {
        self.pending.values().map(Vec::len).sum::<usize>()
            - self.answered.values().map(Vec::len).sum::<usize>()
            + self.null_errors.len()
    }

    /// Takes the notifications already read (every delta of a response read before it).
    pub(super) async fn drain_notifications(&mut self) {
        // `unconstrained`: with the task's coop budget spent, a ready channel would look empty.
        while let Ok(Some(n)) = tokio::task::unconstrained(tokio::time::timeout(
            Duration::ZERO,
            self.client.next_notification(),
        ))
        .await
        {
            let request_id = n.params.get("request_id").cloned();
            let request_id: Option<RequestId> =
                request_id.and_then(|v| serde_json::from_value(v).ok());
            match (n.method.as_str(), request_id) {
                ("generate/delta", Some(id)) if self.generate_ids.contains(&id) => {
                    match serde_json::from_value::<GenerateDelta>(n.params.clone()) {
                        Ok(d) => self.deltas.entry(id).or_default().push(d),
                        Err(e) => self.fail(format!("a malformed delta {n:?}: {e}")),
                    }
                }
                ("load/progress", Some(id)) if self.load_ids.contains(&id) => {
                    if let Err(e) =
                        serde_json::from_value::<protocol::methods::LoadProgress>(n.params.clone())
                    {
                        self.fail(format!("a malformed load/progress {n:?}: {e}"));
                    }
                }
                _ => self.fail(format!("an unexpected notification: {n:?}")),
            }
        }
    }

    pub(super) fn on_response(&mut self, r: Response) {
        self.responses += 1;
        if let Err(e) = &r.outcome {
            *self.errors_by_code.entry(e.code).or_default() += 1;
            if ErrorCode::from_code(e.code).is_none() {
                self.fail(format!(
                    "error code {} is not in the contract: {r:?}",
                    e.code
                ));
            }
            if e.message.is_empty() {
                self.fail(format!("an error without a message: {r:?}"));
            }
        }
        let Some(id) = r.id.clone() else {
            let code = r.outcome.as_ref().map_err(|e| e.code).err();
            match code.and_then(|c| self.null_errors.iter().position(|&x| x == c)) {
                Some(at) => {
                    self.null_errors.remove(at);
                }
                None => self.fail(format!(
                    "an id-null response nobody expected (owed: {:?}): {r:?}",
                    self.null_errors
                )),
            }
            return;
        };
        let owed = self.pending.get(&id).map_or(0, Vec::len);
        let got = self.answered.entry(id.clone()).or_default();
        got.push(r);
        if got.len() > owed {
            let r = got.pop();
            self.fail(format!("a response for an id nothing waits for: {r:?}"));
        }
        if got.len() < owed {
            // A reused id: which request an answer belongs to is settled once all have come.
            return;
        }
        let answers = self.answered.remove(&id).unwrap_or_default();
        let requests = self.pending.remove(&id).unwrap_or_default();
        let Some(order) = assign(&requests, &answers) else {
            let why: Vec<String> = requests
                .iter()
                .flat_map(|p| {
                    answers
                        .iter()
                        .map(move |r| match check_answer(p.method.as_deref(), r) {
                            Ok(()) => format!("fits: {r:?}\n  request: {}", p.line),
                            Err(e) => format!("{e}: {r:?}\n  request: {}", p.line),
                        })
                })
                .collect();
            self.fail(format!(
                "the answers for id {id} do not fit its requests:\n{}",
                why.join("\n")
            ));
        };
        for (p, r) in requests.iter().zip(order.iter().map(|&i| &answers[i])) {
            self.check_deltas(&id, p, r);
        }
    }

    /// Deltas add up to the text, indices count from 0 (when the id was used once).
    pub(super) fn check_deltas(&mut self, id: &RequestId, p: &Pending, r: &Response) {
        let method = p.method.clone().unwrap_or_else(|| "(invalid)".into());
        let code = r.outcome.as_ref().err().map_or(0, |e| e.code);
        *self.outcomes.entry((method, code)).or_default() += 1;
        if p.method.as_deref() != Some(Generate::NAME) || self.sent[id] != 1 {
            return;
        }
        let deltas = self.deltas.remove(id).unwrap_or_default();
        if let Ok(v) = &r.outcome {
            let result: GenerateResult = serde_json::from_value(v.clone()).unwrap();
            let text: String = deltas.iter().map(|d| d.text.as_str()).collect();
            let indices: Vec<u64> = deltas.iter().map(|d| d.index).collect();
            if text != result.text || indices != (0..deltas.len() as u64).collect::<Vec<_>>() {
                self.fail(format!(
                    "{} deltas (indices {indices:?}) make {text:?}, not the result's text {:?} (finish_reason {:?}, {} tokens)\n  request: {}",
                    deltas.len(), result.text, result.finish_reason, result.usage.completion_tokens, p.line
                ));
            }
            self.generations_checked += 1;
        } else if !deltas.is_empty() {
            self.fail(format!("a failed generate sent deltas {deltas:?}: {r:?}"));
        }
    }

    /// Reads responses until every answer owed has come.
    pub(super) async fn barrier(&mut self) {
        let deadline = tokio::time::Instant::now() + BARRIER_LIMIT;
        while self.outstanding() > 0 {
            let next = tokio::time::timeout_at(deadline, self.client.next_unmatched()).await;
            self.drain_notifications().await;
            match next {
                Ok(Some(r)) => self.on_response(r),
                Ok(None) => self.fail(format!(
                    "the worker's stdout closed (it exited: {:?}) with {} answers owed",
                    self.client.wait().await,
                    self.outstanding()
                )),
                Err(_) => {
                    let owed: Vec<String> = self
                        .pending
                        .iter()
                        .flat_map(|(id, ps)| ps.iter().map(move |p| format!("{id}: {}", p.line)))
                        .collect();
                    self.fail(format!(
                        "no answer within {BARRIER_LIMIT:?}; owed: {owed:?}, id-null: {:?}",
                        self.null_errors
                    ))
                }
            }
        }
        self.drain_notifications().await;
    }
}
