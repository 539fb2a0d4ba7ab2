//! stdin and stdout: one task reads lines, one task owns stdout. Nothing else writes there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use protocol::{Message, MessageReader, MessageWriter, Response};
use tokio::io::BufReader;
use tokio::sync::{mpsc, oneshot};

/// What the writer task is asked to do.
enum Outgoing {
    Message(Message),
    /// Answer once everything before it is written and flushed.
    Flush(oneshot::Sender<()>),
}

/// The sending side of stdout; cheap to clone, usable from any thread (the MLX thread too).
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Outgoing>,
    queued: Arc<Queued>,
}

/// Messages handed to the writer and not yet written, so that the MLX thread can wait for a
/// host that is slow to read (or has stopped reading) instead of queueing without bound.
#[derive(Default)]
struct Queued {
    count: Mutex<usize>,
    written: Condvar,
    /// The writer has stopped (stdout is gone): nobody waits any more.
    closed: AtomicBool,
}

/// How many messages may wait for stdout before [`Outbox::send_paced`] waits.
pub const MAX_QUEUED: usize = 256;

impl Outbox {
    /// An outbox and the receiving end its writer drains.
    fn new() -> (Outbox, mpsc::UnboundedReceiver<Outgoing>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(Queued::default());
        (Outbox { tx, queued }, rx)
    }

    /// Queues a message for stdout. Lost only if stdout is gone, when nobody could read it.
    pub fn send(&self, message: impl Into<Message>) {
        *self.queued.count.lock().expect("outbox count") += 1;
        if self.tx.send(Outgoing::Message(message.into())).is_err() {
            self.queued.written();
        }
    }

    /// [`Outbox::send`] for a stream of notifications from the MLX thread (deltas, progress):
    /// first waits while [`MAX_QUEUED`] messages wait for stdout, so that a host that stops
    /// reading pauses the generation instead of growing memory. Stops waiting once `cancelled`
    /// says so (the message is still sent: deltas always add up to the text). Never call it on
    /// a tokio thread.
    pub fn send_paced(&self, message: impl Into<Message>, cancelled: &dyn Fn() -> bool) {
        let mut count = self.queued.count.lock().expect("outbox count");
        while *count >= MAX_QUEUED && !self.queued.closed.load(Ordering::SeqCst) && !cancelled() {
            count = self
                .queued
                .written
                .wait_timeout(count, Duration::from_millis(50))
                .expect("outbox count")
                .0;
        }
        drop(count);
        self.send(message);
    }

    /// Waits until every message queued before this call is on stdout.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Outgoing::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

impl Queued {
    fn written(&self) {
        let mut count = self.count.lock().expect("outbox count");
        *count = count.saturating_sub(1);
        self.written.notify_all();
    }
}

/// Starts the task that owns stdout. The receiver fires when a write fails: the host is gone.
pub fn spawn_writer() -> (Outbox, oneshot::Receiver<()>) {
    let (outbox, mut rx) = Outbox::new();
    let (gone_tx, gone) = oneshot::channel();
    let counter = outbox.queued.clone();
    tokio::spawn(async move {
        let mut writer = MessageWriter::new(tokio::io::stdout());
        while let Some(item) = rx.recv().await {
            match item {
                Outgoing::Message(message) => {
                    let written = writer.write(&message).await;
                    counter.written();
                    if let Err(e) = written {
                        tracing::warn!("stdout is gone ({e}): the host is gone");
                        let _ = gone_tx.send(());
                        break;
                    }
                }
                Outgoing::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
        counter.closed.store(true, Ordering::SeqCst);
        counter.written.notify_all();
    });
    (outbox, gone)
}

/// What the reader task hands to the dispatcher.
pub enum Inbound {
    /// A well-formed message.
    Message(Message),
    /// End of stdin (or a read error): no more requests; what was received still runs.
    Closed,
}

/// Starts the task that reads stdin. Lines that are not messages are answered here, straight
/// to the outbox, with the contract's error; the dispatcher sees only messages.
pub fn spawn_reader(max_line_bytes: usize, outbox: Outbox) -> mpsc::UnboundedReceiver<Inbound> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut reader = MessageReader::new(BufReader::new(tokio::io::stdin()), max_line_bytes);
        while let Some(item) = reader.next_message().await {
            match item {
                Ok(Ok(message)) => {
                    if tx.send(Inbound::Message(message)).is_err() {
                        return;
                    }
                }
                Ok(Err(response)) => reject(&outbox, response),
                Err(e) => {
                    tracing::warn!("reading stdin failed: {e}");
                    break;
                }
            }
        }
        let _ = tx.send(Inbound::Closed);
    });
    rx
}

fn reject(outbox: &Outbox, response: Response) {
    if let Err(e) = &response.outcome {
        tracing::debug!(code = e.code, "rejected a line: {}", e.message);
    }
    outbox.send(response);
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::Notification;
    use std::sync::mpsc as std_mpsc;

    fn note() -> Notification {
        Notification::new("generate/delta", serde_json::json!({}))
    }

    #[test]
    fn send_paced_waits_while_the_queue_is_full_until_a_message_is_written_or_cancel() {
        let (outbox, mut rx) = Outbox::new();
        for _ in 0..MAX_QUEUED {
            outbox.send(note());
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let (done_tx, done) = std_mpsc::channel();
        let (paced, flag) = (outbox.clone(), cancel.clone());
        std::thread::spawn(move || {
            paced.send_paced(note(), &|| false);
            done_tx.send("written").unwrap();
            paced.send_paced(note(), &|| flag.load(Ordering::SeqCst));
            done_tx.send("cancelled").unwrap();
        });
        let wait = Duration::from_millis(300);
        assert!(
            done.recv_timeout(wait).is_err(),
            "did not wait on a full queue"
        );
        // The writer writes one message: the first paced send goes.
        rx.try_recv().unwrap();
        outbox.queued.written();
        assert_eq!(done.recv_timeout(wait * 10), Ok("written"));
        // Full again: the next waits until cancelled, and still sends.
        assert!(
            done.recv_timeout(wait).is_err(),
            "did not wait on a full queue"
        );
        cancel.store(true, Ordering::SeqCst);
        assert_eq!(done.recv_timeout(wait * 10), Ok("cancelled"));
        let mut queued = 0;
        while rx.try_recv().is_ok() {
            queued += 1;
        }
        assert_eq!(queued, MAX_QUEUED + 1, "nothing dropped");
    }
}
