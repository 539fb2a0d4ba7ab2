//! The prompt cache's disk tier: conversations' caches that leave memory (pushed out by newer
//! ones or by a generation that needs the memory, or at unload and exit) are written under
//! `<dir>/<model key>/`, one safetensors file each, and read back when a prompt shares more with
//! one of them than with anything in memory, after a restart too.
//!
//! - Identity: the model key hashes what decides a cache's numbers (the model's and adapter's
//!   files by name, size and time, the options that change the weights or the KV width, MLX's
//!   version and device); a file's name hashes its adapter position and tokens. A file whose
//!   header, checksum, model key or layout does not fit is deleted, never used.
//! - Budgets: the directory stays under `bytes` (least recently used files first, across models;
//!   a read touches its file), and this process writes at most `write_bytes_per_hour` in any
//!   hour (SSD wear): past it, an entry leaving memory is dropped instead.
//! - Several workers on one directory: a file appears by rename (a reader sees all of it or
//!   none), removing a file already gone is not an error, and the budget is enforced under a
//!   lock file, so two workers never both delete for the same excess.

use std::{
    cell::RefCell,
    collections::{HashMap, VecDeque},
    fs,
    io::Read,
    path::{Path, PathBuf},
    rc::Rc,
    time::{Duration, Instant, SystemTime},
};

use mlx_rs::Array;
use safetensors::{tensor::TensorView, SafeTensors};
use xxhash_rust::xxh3::{xxh3_128, Xxh3};

use crate::layers::kv_cache::{self, KvCache, Layout, Snapshot};

/// The format a file is written in; others are deleted.
const FORMAT: &str = "mlx-worker-prompt-cache-1";

/// Where and how much the disk tier keeps (`--disk-cache-bytes`).
#[derive(Debug, Clone)]
pub struct DiskSettings {
    /// The tier's directory (`<cache root>/prompt-cache`).
    pub dir: PathBuf,
    /// Bytes the directory may hold.
    pub bytes: u64,
    /// Bytes this process may write in any hour.
    pub write_bytes_per_hour: u64,
}

/// What the tier has done since the worker started (every model's together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskCounts {
    /// Prompts that resumed from a file.
    pub hits: u64,
    /// Prompt tokens those held.
    pub hit_tokens: u64,
    /// Files written, and their bytes.
    pub writes: u64,
    pub written_bytes: u64,
    /// Entries dropped instead of written (past the write budget, or larger than the tier).
    pub skipped_writes: u64,
    /// Damaged or foreign files deleted.
    pub rejected: u64,
}

/// What the tiers of every resident share: the settings, the hour's writes, the counts.
pub(crate) struct DiskShared {
    pub settings: DiskSettings,
    writes: VecDeque<(Instant, u64)>,
    pub counts: DiskCounts,
}

impl DiskShared {
    pub fn new(settings: DiskSettings) -> Rc<RefCell<Self>> {
        Rc::new(RefCell::new(Self {
            settings,
            writes: VecDeque::new(),
            counts: DiskCounts::default(),
        }))
    }

    /// Whether `bytes` more may be written within the hour's budget (and the tier's).
    fn may_write(&mut self, bytes: u64) -> bool {
        let hour = Duration::from_secs(3600);
        while self.writes.front().is_some_and(|(t, _)| t.elapsed() > hour) {
            self.writes.pop_front();
        }
        let written: u64 = self.writes.iter().map(|(_, b)| b).sum();
        bytes <= self.settings.bytes && written + bytes <= self.settings.write_bytes_per_hour
    }

    /// Counts a file of `bytes` written.
    fn wrote(&mut self, bytes: u64) {
        self.writes.push_back((Instant::now(), bytes));
        (self.counts.writes, self.counts.written_bytes) =
            (self.counts.writes + 1, self.counts.written_bytes + bytes);
    }
}

/// One conversation's caches, as written or read.
pub(crate) struct Entry {
    pub caches: Vec<KvCache>,
    pub snapshots: Vec<Snapshot>,
    pub tokens: Vec<u32>,
    pub adapter_on: bool,
    pub conversation: Option<String>,
}

/// What the tier knows of a file without reading its arrays.
#[derive(Debug, Clone)]
pub(crate) struct Indexed {
    pub tokens: Vec<u32>,
    pub adapter_on: bool,
    pub conversation: Option<String>,
    pub bytes: u64,
}

/// Why a file is not used: damaged or foreign (it is deleted), or not read this time (an I/O
/// error: gone meanwhile, too many open files; it stays).
enum Unusable {
    Damaged(String),
    Unread(String),
}

impl From<String> for Unusable {
    fn from(why: String) -> Self {
        Unusable::Damaged(why)
    }
}

/// One resident's files.
pub(crate) struct DiskTier {
    shared: Rc<RefCell<DiskShared>>,
    model_key: String,
    /// `<dir>/<model key>`.
    dir: PathBuf,
    /// The files seen so far, by name.
    index: HashMap<String, Indexed>,
}

impl DiskTier {
    pub fn new(shared: Rc<RefCell<DiskShared>>, model_key: String) -> Self {
        let dir = shared.borrow().settings.dir.join(&model_key);
        Self {
            shared,
            model_key,
            dir,
            index: HashMap::new(),
        }
    }

    /// Counts a prompt that resumed from a file read in, holding `tokens` of it.
    pub fn count_hit(&self, tokens: u64) {
        let counts = &mut self.shared.borrow_mut().counts;
        (counts.hits, counts.hit_tokens) = (counts.hits + 1, counts.hit_tokens + tokens);
    }

    /// The files there now (other workers may have written or removed some).
    pub fn files(&mut self) -> &HashMap<String, Indexed> {
        let names: Vec<String> = fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.ends_with(".safetensors") && !n.starts_with('.'))
            .collect();
        self.index.retain(|name, _| names.contains(name));
        for name in names {
            if self.index.contains_key(&name) {
                continue;
            }
            match self.header(&name) {
                Ok(indexed) => {
                    self.index.insert(name, indexed);
                }
                Err(Unusable::Damaged(why)) => self.reject(&name, &why),
                Err(Unusable::Unread(why)) => {
                    tracing::debug!(file = %name, "prompt cache file skipped: {why}")
                }
            }
        }
        &self.index
    }

    /// The file sharing the longest prefix with `prompt` (computed with the adapter as
    /// `adapter_on` says): how many tokens ([`shared_prefix`]), its name and its bytes.
    pub fn best(&mut self, prompt: &[u32], adapter_on: bool) -> Option<(usize, String, u64)> {
        (self.files().iter())
            .filter(|(_, i)| i.adapter_on == adapter_on)
            .map(|(name, i)| (shared_prefix(&i.tokens, prompt), name.clone(), i.bytes))
            .filter(|(n, _, _)| *n > 0)
            .max()
    }

    /// Reads file `name` into caches of the kinds `template` has; a file that does not fit is
    /// deleted and `None` returned.
    pub fn read(&mut self, name: &str, template: &[KvCache]) -> Option<Entry> {
        let path = self.dir.join(name);
        match self.read_file(&path, template) {
            Ok(entry) => {
                // Used now: the last to go when the directory is over its budget.
                let file = fs::File::options().write(true).open(&path);
                let _ = file.and_then(|f| f.set_modified(SystemTime::now()));
                Some(entry)
            }
            Err(Unusable::Damaged(why)) => {
                self.reject(name, &why);
                None
            }
            Err(Unusable::Unread(why)) => {
                tracing::warn!(file = %path.display(), "prompt cache file not read: {why}");
                self.index.remove(name);
                None
            }
        }
    }

    fn read_file(&self, path: &Path, template: &[KvCache]) -> Result<Entry, Unusable> {
        let bytes = fs::read(path).map_err(|e| Unusable::Unread(e.to_string()))?;
        Ok(self.parse(&bytes, template)?)
    }

    /// A file's bytes as an entry, every check passed.
    fn parse(&self, bytes: &[u8], template: &[KvCache]) -> Result<Entry, String> {
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| e.to_string())?;
        let meta = header.metadata().clone().unwrap_or_default();
        let tensors = SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
        let mut views = tensors.tensors();
        views.sort_by(|a, b| a.0.cmp(&b.0));
        let field = |key: &str| meta.get(key).ok_or(format!("no {key} in its header"));
        if *field("checksum")? != checksum(&meta, &views) {
            return Err("its checksum does not match: the file is damaged".into());
        }
        let indexed = self.indexed(&meta, bytes.len() as u64)?;
        let layout: Layout =
            serde_json::from_str(field("layout")?).map_err(|e| format!("layout: {e}"))?;
        let arrays = (views.into_iter())
            .map(|(name, view)| Array::try_from(view).map(|a| (name, a)))
            .collect::<Result<HashMap<_, _>, _>>()
            .map_err(|e| e.to_string())?;
        let (caches, snapshots) = kv_cache::restore(&layout, arrays, template)?;
        let held = indexed.tokens.len() as i32;
        if caches.iter().any(|c| c.offset() != held) {
            return Err(format!("its caches do not hold its {held} tokens"));
        }
        Ok(Entry {
            caches,
            snapshots,
            tokens: indexed.tokens,
            adapter_on: indexed.adapter_on,
            conversation: indexed.conversation,
        })
    }

    /// Reads a file's header alone.
    fn header(&self, name: &str) -> Result<Indexed, Unusable> {
        let path = self.dir.join(name);
        let unread = |e: std::io::Error| Unusable::Unread(e.to_string());
        let mut file = fs::File::open(&path).map_err(unread)?;
        let len = file.metadata().map_err(unread)?.len();
        if len < 8 {
            return Err(Unusable::Damaged("shorter than a header".into()));
        }
        let mut n = [0u8; 8];
        file.read_exact(&mut n).map_err(unread)?;
        let n = u64::from_le_bytes(n);
        if n > 64 << 20 || n + 8 > len {
            return Err(Unusable::Damaged(
                "its header length is out of range".into(),
            ));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(unread)?;
        #[derive(serde::Deserialize)]
        struct Header {
            #[serde(rename = "__metadata__", default)]
            metadata: HashMap<String, String>,
        }
        let header: Header = serde_json::from_slice(&header).map_err(|e| e.to_string())?;
        Ok(self.indexed(&header.metadata, len)?)
    }

    /// What a header says, checked against this model.
    fn indexed(&self, meta: &HashMap<String, String>, bytes: u64) -> Result<Indexed, String> {
        let field = |key: &str| meta.get(key).ok_or(format!("no {key} in its header"));
        if field("format")? != FORMAT {
            return Err(format!("written in another format ({})", field("format")?));
        }
        if *field("model")? != self.model_key {
            return Err("written for another model".into());
        }
        let tokens: Vec<u32> =
            serde_json::from_str(field("tokens")?).map_err(|e| format!("tokens: {e}"))?;
        if tokens.is_empty() {
            return Err("it holds no tokens".into());
        }
        Ok(Indexed {
            tokens,
            adapter_on: field("adapter_on")? == "true",
            conversation: meta.get("conversation").cloned(),
            bytes,
        })
    }

    /// Deletes a file that must not be used, and says why.
    fn reject(&mut self, name: &str, why: &str) {
        tracing::warn!(file = %self.dir.join(name).display(), "prompt cache file deleted: {why}");
        remove(&self.dir.join(name));
        self.index.remove(name);
        self.shared.borrow_mut().counts.rejected += 1;
    }

    /// Writes `entry` (unless the budgets say no), deletes the files it makes redundant (those
    /// of its conversation, and those holding a prefix of its tokens), and keeps the directory
    /// within its budget. Returns whether it was written.
    pub fn write(&mut self, entry: &Entry) -> bool {
        let Some((layout, arrays)) = kv_cache::store(&entry.caches, &entry.snapshots) else {
            return false;
        };
        let arrays = match contiguous(arrays) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("prompt cache entry not written: {e}");
                return false;
            }
        };
        let bytes: u64 = arrays.iter().map(|(_, a)| a.nbytes() as u64).sum();
        if !self.shared.borrow_mut().may_write(bytes) {
            tracing::info!(
                bytes,
                "prompt cache entry dropped: past the disk write budget"
            );
            self.shared.borrow_mut().counts.skipped_writes += 1;
            return false;
        }
        let owner = (entry.adapter_on, entry.conversation.as_deref());
        let name = self.file_name(&entry.tokens, owner);
        match self.write_file(&name, entry, &layout, &arrays) {
            Ok(len) => self.shared.borrow_mut().wrote(len),
            Err(e) => {
                tracing::warn!("prompt cache entry not written: {e}");
                return false;
            }
        }
        let redundant: Vec<String> = (self.files().iter())
            .filter(|(n, i)| {
                **n != name
                    && i.adapter_on == entry.adapter_on
                    && ((i.conversation.is_some() && i.conversation == entry.conversation)
                        || (i.conversation.is_none() && entry.tokens.starts_with(&i.tokens)))
            })
            .map(|(n, _)| n.clone())
            .collect();
        for n in redundant {
            self.remove(&n);
        }
        self.enforce_budget();
        true
    }

    fn write_file(
        &self,
        name: &str,
        entry: &Entry,
        layout: &Layout,
        arrays: &[(String, Array)],
    ) -> Result<u64, String> {
        let mut views = (arrays.iter())
            .map(|(n, a)| TensorView::try_from(a).map(|v| (n.clone(), v)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        views.sort_by(|a, b| a.0.cmp(&b.0));
        let mut meta = HashMap::from([
            ("format".to_owned(), FORMAT.to_owned()),
            ("model".to_owned(), self.model_key.clone()),
            ("adapter_on".to_owned(), entry.adapter_on.to_string()),
            (
                "tokens".to_owned(),
                serde_json::to_string(&entry.tokens).unwrap(),
            ),
            ("layout".to_owned(), serde_json::to_string(layout).unwrap()),
        ]);
        if let Some(c) = &entry.conversation {
            meta.insert("conversation".to_owned(), c.clone());
        }
        meta.insert("checksum".to_owned(), checksum(&meta, &views));
        fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let tmp = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        safetensors::serialize_to_file(views, Some(meta), &tmp).map_err(|e| e.to_string())?;
        let len = fs::metadata(&tmp).map(|m| m.len()).unwrap_or(0);
        fs::rename(&tmp, self.dir.join(name)).map_err(|e| {
            remove(&tmp);
            e.to_string()
        })?;
        Ok(len)
    }

    /// Deletes file `name` (a conversation evicted, or made redundant).
    pub fn remove(&mut self, name: &str) {
        remove(&self.dir.join(name));
        self.index.remove(name);
    }

    /// The name of the file holding `tokens` computed with the adapter as `adapter_on` says,
    /// for `conversation` (two conversations holding the same tokens keep a file each).
    pub fn file_name(&self, tokens: &[u32], owner: (bool, Option<&str>)) -> String {
        let (adapter_on, conversation) = owner;
        let mut bytes: Vec<u8> = vec![adapter_on as u8];
        if let Some(c) = conversation {
            bytes.extend([1u8].iter().chain(c.as_bytes()).chain(&[0u8]));
        }
        bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
        format!("{:032x}.safetensors", xxh3_128(&bytes))
    }

    /// Deletes the least recently used files of every model until the directory fits its
    /// budget (and temporary files a crashed writer left an hour ago), under the lock file.
    fn enforce_budget(&self) {
        let root = self.shared.borrow().settings.dir.clone();
        let budget = self.shared.borrow().settings.bytes;
        let Ok(lock) = fs::File::create(root.join(".lock")) else {
            return;
        };
        if lock.lock().is_err() {
            return;
        }
        let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        let dirs = fs::read_dir(&root).into_iter().flatten().flatten();
        for entry in dirs.flat_map(|d| fs::read_dir(d.path()).into_iter().flatten().flatten()) {
            let (path, Ok(meta)) = (entry.path(), entry.metadata()) else {
                continue;
            };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let stale = modified
                    .elapsed()
                    .is_ok_and(|d| d > Duration::from_secs(3600));
                if stale {
                    remove(&path);
                }
            } else if name.ends_with(".safetensors") {
                files.push((modified, meta.len(), path));
            }
        }
        files.sort();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        for (_, len, path) in files {
            if total <= budget {
                break;
            }
            remove(&path);
            total -= len;
        }
        let _ = lock.unlock();
    }
}

/// How many leading tokens of `prompt` caches holding `kept` can give: the common prefix, at
/// most all of the prompt but its last token (which must run to give the first logits). The
/// prompt cache's rule, in memory and on disk.
pub(crate) fn shared_prefix(kept: &[u32], prompt: &[u32]) -> usize {
    let same = kept.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    same.min(prompt.len().saturating_sub(1))
}

/// The files under the tier's directory, and their bytes.
pub(crate) fn usage(dir: &Path) -> (u64, u64) {
    let dirs = fs::read_dir(dir).into_iter().flatten().flatten();
    let files = dirs.flat_map(|d| fs::read_dir(d.path()).into_iter().flatten().flatten());
    let files = files.filter(|f| f.file_name().to_string_lossy().ends_with(".safetensors"));
    files.fold((0, 0), |(n, bytes), f| {
        (n + 1, bytes + f.metadata().map_or(0, |m| m.len()))
    })
}

/// Removes a file, gone already or not.
fn remove(path: &Path) {
    if let Err(e) = fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(file = %path.display(), "could not delete: {e}");
        }
    }
}

/// The arrays, row-contiguous and evaluated (as a file stores them).
fn contiguous(arrays: kv_cache::Arrays) -> mlx_rs::error::Result<kv_cache::Arrays> {
    arrays
        .into_iter()
        .map(|(name, a)| {
            a.eval()?;
            let a = match a.try_as_slice::<u8>() {
                Err(mlx_rs::error::AsSliceError::NotContiguous) => a.contiguous()?,
                _ => a,
            };
            a.eval()?;
            Ok((name, a))
        })
        .collect()
}

/// A hash of a file's header fields and arrays: a file whose bytes changed does not match.
fn checksum(meta: &HashMap<String, String>, views: &[(String, TensorView)]) -> String {
    let mut hash = Xxh3::new();
    let mut keys: Vec<&String> = meta.keys().filter(|k| *k != "checksum").collect();
    keys.sort();
    for k in keys {
        hash.update(k.as_bytes());
        hash.update(meta[k].as_bytes());
    }
    for (name, view) in views {
        hash.update(name.as_bytes());
        hash.update(format!("{:?}{:?}", view.dtype(), view.shape()).as_bytes());
        hash.update(view.data());
    }
    format!("{:032x}", hash.digest128())
}

/// The identity of a resident's caches: what decides their numbers.
pub(crate) fn model_key(
    paths: &[&Path],
    options: &str,
    device: &crate::layers::device::DeviceInfo,
) -> String {
    let mut hash = Xxh3::new();
    hash.update(FORMAT.as_bytes());
    hash.update(options.as_bytes());
    hash.update(
        format!(
            "{}|{:?}|{}",
            device.mlx_version, device.backend, device.name
        )
        .as_bytes(),
    );
    for path in paths {
        hash.update(path.to_string_lossy().as_bytes());
        let mut files: Vec<(String, u64, u128)> = match fs::read_dir(path) {
            Ok(dir) => dir
                .flatten()
                .filter_map(|e| file_stamp(&e.path()))
                .collect(),
            Err(_) => file_stamp(path).into_iter().collect(),
        };
        files.sort();
        for (name, len, time) in files {
            hash.update(format!("{name}|{len}|{time}").as_bytes());
        }
    }
    format!("{:032x}", hash.digest128())
}

/// A file's name, size and modification time (following links, as the hub cache's are).
fn file_stamp(path: &Path) -> Option<(String, u64, u128)> {
    let meta = fs::metadata(path).ok().filter(|m| m.is_file())?;
    let time = meta
        .modified()
        .ok()?
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?;
    let name = path.file_name()?.to_string_lossy().into_owned();
    Some((name, meta.len(), time.as_nanos()))
}
