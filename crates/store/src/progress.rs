/// The stages of a load, in order (the protocol's `load/progress` names them the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadStage {
    /// Finding the files: a directory, a hub snapshot, a GGUF import.
    Resolve,
    /// Downloading a file from the hub.
    Download,
    /// Reading (and converting) the weights.
    Weights,
    /// Reading the tokenizer and chat template.
    Tokenizer,
    /// Resident and usable.
    Ready,
}

/// Progress of a load, reported as it happens.
#[derive(Debug, Clone)]
pub struct LoadProgress {
    pub stage: LoadStage,
    pub done: u64,
    pub total: u64,
    pub message: String,
}
