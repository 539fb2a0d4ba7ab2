//! stdin and stdout: one task reads lines, one task owns stdout. Nothing else writes there.

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
pub struct Outbox(mpsc::UnboundedSender<Outgoing>);

impl Outbox {
    /// Queues a message for stdout. Lost only if stdout is gone, when nobody could read it.
    pub fn send(&self, message: impl Into<Message>) {
        let _ = self.0.send(Outgoing::Message(message.into()));
    }

    /// Waits until every message queued before this call is on stdout.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.0.send(Outgoing::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// Starts the task that owns stdout. The receiver fires when a write fails: the host is gone.
pub fn spawn_writer() -> (Outbox, oneshot::Receiver<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (gone_tx, gone) = oneshot::channel();
    tokio::spawn(async move {
        let mut writer = MessageWriter::new(tokio::io::stdout());
        while let Some(item) = rx.recv().await {
            match item {
                Outgoing::Message(message) => {
                    if let Err(e) = writer.write(&message).await {
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
    });
    (Outbox(tx), gone)
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
