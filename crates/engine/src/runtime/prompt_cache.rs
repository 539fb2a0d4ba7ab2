//! The prompt cache: a resident model keeps the KV caches of its recent generations (several
//! conversations, least recently used first out, bounded in bytes) and the tokens they hold;
//! the next generation whose prompt starts with the same tokens as one of them (a chat's next
//! turn) prefills only the rest. `usage.cached_tokens` reports the reuse.
//!
//! A prompt takes the entry sharing its longest prefix. Reused caches are cut back to the
//! shared prefix (at most the prompt minus its last token, which must run to give the first
//! logits). An entry the prompt extends whole is moved out (the generation's caches replace
//! it); one it shares only a part of is copied and the copy cut back, so the other
//! conversation keeps its entry (copies share MLX arrays until written). A cache that cannot
//! be cut back (a sliding-window ring that has wrapped; a linear-attention layer's recurrent
//! state, reused whole when the new prompt extends the kept tokens, else from a snapshot of it
//! taken at an earlier position) or that was made with the adapter in the other position is
//! not reused.

use std::{cell::Cell, rc::Rc};

use crate::layers::kv_cache::{KvCache, Snapshot};
use crate::runtime::disk_cache::{shared_prefix, DiskTier, Entry};

/// The default byte budget of a resident's prompt cache (`--prompt-cache-bytes`).
pub const DEFAULT_PROMPT_CACHE_BYTES: u64 = 1 << 30;

pub(crate) struct PromptCache {
    /// Least recently used first.
    entries: Vec<Kept>,
    /// Bytes the entries may hold together; the newest entry is kept even past it.
    budget: u64,
    /// Where entries go when they leave memory, if anywhere.
    disk: Option<DiskTier>,
    /// What the engine's prompt caches have served (shared by its residents).
    counts: Rc<Cell<Counts>>,
}

/// Prompts looked up in the prompt cache, and those that reused an entry in memory (and how
/// many tokens); the disk tier counts its own ([`DiskCounts`](super::disk_cache::DiskCounts)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub lookups: u64,
    pub hits: u64,
    pub hit_tokens: u64,
}

/// Whose caches these are: computed with the adapter (if any) on or off, for a conversation
/// the host named or for none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    pub adapter_on: bool,
    pub conversation: Option<String>,
}

/// Which drafter of a speculative generation made [`DraftCaches`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrafterKey {
    /// A draft model (`draft_model`, a smaller model).
    Model,
    /// The model's own multi-token-prediction head.
    Mtp,
    /// An EAGLE-3 drafter.
    Eagle3,
    /// A DFlash, DFlash2 or DSpark block drafter.
    Block,
}

/// A speculative generation's drafter caches, kept beside the model's. They hold as many
/// positions as the model's (the drafter caught up at the end; a block drafter's position `i`
/// is the context of position `i`, a multi-token-prediction head's the token after it), so
/// they are cut back with them, and the next generation's drafter starts where the model's
/// prefill starts.
#[derive(Clone)]
pub struct DraftCaches {
    pub drafter: DrafterKey,
    pub caches: Vec<KvCache>,
    /// The token after the last position held, where known: a multi-token-prediction head's
    /// or EAGLE-3's last position read it, so a prompt with another token there cannot use it.
    pub follows: Option<u32>,
}

impl DraftCaches {
    /// Positions held.
    pub fn offset(&self) -> usize {
        self.caches
            .first()
            .map_or(0, |c| c.offset().max(0) as usize)
    }

    /// Cut back to `n` positions, `next` the sequence's token after them (if known); `None`
    /// when they hold fewer (they fell behind the model's).
    fn cut_to(mut self, n: usize, next: Option<u32>) -> Option<Self> {
        let drop = self.offset().checked_sub(n)?;
        if !self.caches.iter_mut().all(|c| c.trim(drop as i32)) {
            return None;
        }
        self.follows = next.or(self.follows.filter(|_| drop == 0));
        Some(self)
    }

    /// Whether a generation from `prompt`, whose first `n` positions these hold, can use them:
    /// a head's last position must have read the prompt's token after them.
    fn serves(&self, prompt: &[u32], n: usize) -> bool {
        match self.drafter {
            DrafterKey::Mtp | DrafterKey::Eagle3 => self.follows == prompt.get(n).copied(),
            DrafterKey::Model | DrafterKey::Block => true,
        }
    }

    fn bytes(&self) -> u64 {
        let arrays = self.caches.iter().flat_map(KvCache::arrays);
        arrays.map(|a| a.nbytes() as u64).sum()
    }
}

struct Kept {
    caches: Vec<KvCache>,
    /// The drafter's caches of the speculative generation that made the entry, if any.
    draft: Option<DraftCaches>,
    /// The tokens the caches hold, in order.
    tokens: Vec<u32>,
    /// A hybrid model's recurrent states at earlier positions (ascending), where a prompt that
    /// leaves `tokens` can resume.
    snapshots: Vec<Snapshot>,
    owner: Owner,
    /// Kept in memory past the budget (pushed out only when a generation needs the memory).
    pinned: bool,
    /// A file of the disk tier holds the same (read from it and not changed since).
    stored: bool,
    /// Read from disk for a prompt and not yet used: its first use counts as the disk's hit.
    read_for_use: bool,
}

/// A kept conversation, as `cache_list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    pub conversation_id: Option<String>,
    pub tokens: usize,
    pub bytes: u64,
    /// In memory, else only on disk.
    pub in_memory: bool,
    pub pinned: bool,
}

impl Kept {
    /// How many leading tokens of `prompt` this entry could give (0 if none).
    fn shared(&self, prompt: &[u32], adapter_on: bool) -> usize {
        match self.owner.adapter_on == adapter_on {
            true => shared_prefix(&self.tokens, prompt),
            false => 0,
        }
    }

    fn bytes(&self) -> u64 {
        self.model_bytes() + self.draft.as_ref().map_or(0, DraftCaches::bytes)
    }

    /// The model's caches and snapshots, which a generation's footprint counts (a drafter's
    /// beside them are not priced there).
    fn model_bytes(&self) -> u64 {
        let arrays = self.caches.iter().flat_map(KvCache::arrays);
        let snapshots: u64 = self.snapshots.iter().map(Snapshot::bytes).sum();
        arrays.map(|a| a.nbytes() as u64).sum::<u64>() + snapshots
    }

    /// An entry read from the disk tier (which keeps no drafter caches).
    fn of(entry: Entry) -> Self {
        Self {
            caches: entry.caches,
            draft: None,
            tokens: entry.tokens,
            snapshots: entry.snapshots,
            owner: Owner {
                adapter_on: entry.adapter_on,
                conversation: entry.conversation,
            },
            pinned: false,
            stored: true,
            read_for_use: true,
        }
    }

    fn entry(self) -> Entry {
        Entry {
            caches: self.caches,
            snapshots: self.snapshots,
            tokens: self.tokens,
            adapter_on: self.owner.adapter_on,
            conversation: self.owner.conversation,
        }
    }
}

impl Default for PromptCache {
    fn default() -> Self {
        Self::new(DEFAULT_PROMPT_CACHE_BYTES)
    }
}

impl PromptCache {
    pub fn new(budget: u64) -> Self {
        Self {
            entries: Vec::new(),
            budget,
            disk: None,
            counts: Rc::default(),
        }
    }

    /// Entries leaving memory go to `disk`, and come back from it; lookups and hits are counted
    /// in `counts`.
    pub fn with_tiers(mut self, disk: Option<DiskTier>, counts: Rc<Cell<Counts>>) -> Self {
        (self.disk, self.counts) = (disk, counts);
        self
    }

    /// Caches for generating from `prompt`: a kept entry's cut back to the longest prefix it
    /// shares with it (for a hybrid model whose states cannot be cut back, to its latest
    /// snapshot within that prefix), or fresh ones. Returns the caches, how many prompt tokens
    /// they already hold, the entry's snapshots within those (still prefixes of the prompt),
    /// and its drafter's caches cut back to the same. With `lend`, an entry the prompt extends whole lends a copy too (the generation
    /// will not be kept in its place). A file of the disk tier is read in before, by
    /// [`Self::read_in`], where memory allows.
    pub fn take(
        &mut self,
        prompt: &[u32],
        (owner, lend): (&Owner, bool),
        make_caches: impl Fn() -> Vec<KvCache>,
    ) -> (Vec<KvCache>, usize, Vec<Snapshot>, Option<DraftCaches>) {
        let mut counts = self.counts.get();
        counts.lookups += 1;
        let Some((shared, i, copies)) = self.reuse(prompt, (owner, lend)) else {
            self.counts.set(counts);
            return (make_caches(), 0, Vec::new(), None);
        };
        let from_disk = std::mem::take(&mut self.entries[i].read_for_use);
        let drop = (self.entries[i].tokens.len() - shared) as i32;
        // The entry's token after the shared prefix (before it, the prompt's are the same).
        let after = self.entries[i].tokens.get(shared).copied();
        let (mut caches, snapshots, draft) = if copies {
            // Used now: the entry moves to the most recent end, and lends a copy.
            let entry = self.entries.remove(i);
            let copy = (
                entry.caches.clone(),
                entry.snapshots.clone(),
                entry.draft.clone(),
            );
            self.entries.push(entry);
            copy
        } else {
            let entry = self.entries.remove(i);
            (entry.caches, entry.snapshots, entry.draft)
        };
        let Some(at) = cut_back(&mut caches, &snapshots, drop, shared) else {
            self.counts.set(counts);
            return (make_caches(), 0, Vec::new(), None);
        };
        match &self.disk {
            Some(disk) if from_disk => disk.count_hit(at as u64),
            _ => {
                (counts.hits, counts.hit_tokens) = (counts.hits + 1, counts.hit_tokens + at as u64)
            }
        }
        self.counts.set(counts);
        let within = snapshots.into_iter().filter(|s| s.positions <= at);
        (
            caches,
            at,
            within.collect(),
            (draft.and_then(|d| {
                d.cut_to(
                    at,
                    if at < shared {
                        prompt.get(at).copied()
                    } else {
                        after
                    },
                )
            }))
            .filter(|d| d.serves(prompt, at)),
        )
    }

    /// Reads in the file of the disk tier sharing the longest prefix with `prompt` when it
    /// shares more than any entry in memory and its bytes fit `room`: it becomes the newest
    /// entry (past the budget until the next generation is kept). Whether it did.
    pub fn read_in(
        &mut self,
        prompt: &[u32],
        adapter_on: bool,
        make_caches: &dyn Fn() -> Vec<KvCache>,
        room: u64,
    ) -> bool {
        let in_memory = self
            .entries
            .iter()
            .map(|e| e.shared(prompt, adapter_on))
            .max();
        let Some(disk) = &mut self.disk else {
            return false;
        };
        let Some((shared, name, bytes)) = disk.best(prompt, adapter_on) else {
            return false;
        };
        if shared <= in_memory.unwrap_or(0) || bytes > room {
            return false;
        }
        let Some(entry) = disk.read(&name, &make_caches()) else {
            return false;
        };
        self.entries.push(Kept::of(entry));
        true
    }

    /// The entry `prompt` would reuse: how many tokens it shares, its index, and whether it
    /// would be copied (an entry it shares only a part of, a pinned one or another named
    /// conversation's, any with `lend`) rather than taken over (one the prompt extends whole).
    /// The longest prefix wins; among equals the owner's own conversation, then the newest.
    fn reuse(&self, prompt: &[u32], (owner, lend): (&Owner, bool)) -> Option<(usize, usize, bool)> {
        let best = (self.entries.iter().enumerate())
            .map(|(i, e)| {
                let own = e.owner.conversation == owner.conversation;
                (e.shared(prompt, owner.adapter_on), own, i)
            })
            .max();
        let (shared, _, i) = best.filter(|&(shared, _, _)| shared > 0)?;
        let e = &self.entries[i];
        let others = e.owner.conversation.is_some() && e.owner.conversation != owner.conversation;
        let copies = lend || shared < e.tokens.len() || e.pinned || others;
        Some((shared, i, copies))
    }

    /// What [`Self::take`] would do to memory for `prompt`: the bytes of the entry it would
    /// copy (one it shares only a part of, or any with `lend`: MLX copies an array written
    /// while another holds it, storage whole), and those of the entry it would take over (one
    /// the prompt extends whole: already held, they grow in place of a fresh cache).
    pub fn reuse_bytes(&self, prompt: &[u32], reuse: (&Owner, bool)) -> (u64, u64) {
        match self.reuse(prompt, reuse) {
            Some((_, i, true)) => (self.entries[i].model_bytes(), 0),
            Some((_, i, false)) => (0, self.entries[i].model_bytes()),
            None => (0, 0),
        }
    }

    /// Bytes of every entry in memory.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(Kept::bytes).sum()
    }

    /// Entries in memory.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Keeps `caches` (and the drafter's `draft`, cut back with them) after a generation fed
    /// them `prompt`, then `sampled` tokens in order. They may hold fewer positions than that
    /// (cancelled mid-prefill) or a few more (a step queued ahead for a token never read);
    /// either way only what is known is kept. The entry
    /// of the same named conversation is replaced (its pin goes on to the new one), unnamed
    /// entries whose tokens start the new one's are dropped (it serves their prompts too),
    /// then the least recently used leave memory (for the disk tier, if any) until the rest fit
    /// the budget.
    pub fn keep(
        &mut self,
        (mut caches, mut snapshots, draft): (Vec<KvCache>, Vec<Snapshot>, Option<DraftCaches>),
        prompt: &[u32],
        sampled: &[u32],
        owner: &Owner,
    ) {
        let held = caches.first().map_or(0, |c| c.offset().max(0) as usize);
        let tokens: Vec<u32> = prompt.iter().chain(sampled).take(held).copied().collect();
        let extra = (held - tokens.len()) as i32;
        if tokens.is_empty() || !caches.iter_mut().all(|c| c.trim(extra)) {
            return;
        }
        let replaced = |e: &Kept| {
            e.owner.adapter_on == owner.adapter_on
                && match (&e.owner.conversation, &owner.conversation) {
                    (Some(a), Some(b)) => a == b,
                    (None, _) => !e.pinned && tokens.starts_with(&e.tokens),
                    (Some(_), None) => false,
                }
        };
        let pinned = self.entries.iter().any(|e| replaced(e) && e.pinned);
        self.entries.retain(|e| !replaced(e));
        snapshots.retain(|s| s.positions > 0 && s.positions < tokens.len());
        let next = prompt.iter().chain(sampled).nth(tokens.len()).copied();
        let draft = draft.and_then(|d| d.cut_to(tokens.len(), next));
        self.entries.push(Kept {
            caches,
            draft,
            tokens,
            snapshots,
            owner: owner.clone(),
            pinned,
            stored: false,
            read_for_use: false,
        });
        self.fit_budget();
    }

    /// Moves the least recently used unpinned entries (never the newest) out of memory until
    /// the rest fit the budget.
    fn fit_budget(&mut self) {
        let mut total: u64 = self.entries.iter().map(Kept::bytes).sum();
        while total > self.budget {
            let newest = self.entries.len().saturating_sub(1);
            let Some(i) = (0..newest).find(|&i| !self.entries[i].pinned) else {
                break;
            };
            let entry = self.entries.remove(i);
            total -= entry.bytes();
            self.spill(entry);
        }
    }

    /// An entry leaving memory: to the disk tier, unless a file holds it already.
    fn spill(&mut self, entry: Kept) {
        if let (Some(disk), false) = (&mut self.disk, entry.stored) {
            disk.write(&entry.entry());
        }
    }

    /// Moves the least recently used entry out of memory (pinned ones last), the one `prompt`
    /// would reuse last; `false` when none is left.
    pub fn drop_oldest(&mut self, prompt: &[u32], owner: &Owner) -> bool {
        let best = self.reuse(prompt, (owner, false)).map(|(_, i, _)| i);
        let order = |pinned: bool| {
            (0..self.entries.len()).find(|&i| Some(i) != best && self.entries[i].pinned == pinned)
        };
        let oldest = order(false).or_else(|| order(true)).or(best);
        match oldest {
            Some(i) => {
                let entry = self.entries.remove(i);
                self.spill(entry);
                true
            }
            None => false,
        }
    }

    /// Forgets every entry in memory (`reset`); files stay.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Moves every entry to the disk tier, if there is one (unload, exit).
    pub fn spill_all(&mut self) {
        for entry in std::mem::take(&mut self.entries) {
            self.spill(entry);
        }
    }

    /// Every kept conversation: those in memory (least recently used first), then those only
    /// on disk (not a named one's older file while it is in memory).
    pub fn list(&mut self) -> Vec<Conversation> {
        let mut list: Vec<Conversation> = (self.entries.iter())
            .map(|e| Conversation {
                conversation_id: e.owner.conversation.clone(),
                tokens: e.tokens.len(),
                bytes: e.bytes(),
                in_memory: true,
                pinned: e.pinned,
            })
            .collect();
        if let Some(disk) = &mut self.disk {
            let in_memory: Vec<String> = (self.entries.iter())
                .map(|e| {
                    disk.file_name(
                        &e.tokens,
                        (e.owner.adapter_on, e.owner.conversation.as_deref()),
                    )
                })
                .collect();
            // A named conversation in memory is that conversation (a file of it holds an
            // older turn, replaced when the newer one is written).
            let named_in_memory = |c: &Option<String>| {
                c.is_some() && self.entries.iter().any(|e| e.owner.conversation == *c)
            };
            let mut files: Vec<_> = (disk.files().iter())
                .filter(|(name, i)| !in_memory.contains(name) && !named_in_memory(&i.conversation))
                .map(|(_, i)| Conversation {
                    conversation_id: i.conversation.clone(),
                    tokens: i.tokens.len(),
                    bytes: i.bytes,
                    in_memory: false,
                    pinned: false,
                })
                .collect();
            files.sort_by(|a, b| {
                (&a.conversation_id, a.tokens).cmp(&(&b.conversation_id, b.tokens))
            });
            list.extend(files);
        }
        list
    }

    /// The index of conversation `id`'s entry in memory, read in from disk if it is only
    /// there.
    fn find(&mut self, id: &str, make_caches: &dyn Fn() -> Vec<KvCache>) -> Option<usize> {
        let named = |e: &Kept| e.owner.conversation.as_deref() == Some(id);
        if let Some(i) = self.entries.iter().position(named) {
            return Some(i);
        }
        let disk = self.disk.as_mut()?;
        let files = disk.files().iter();
        let (name, _) = files
            .filter(|(_, i)| i.conversation.as_deref() == Some(id))
            .max_by_key(|(_, i)| i.tokens.len())?;
        let name = name.clone();
        let entry = disk.read(&name, &make_caches())?;
        self.entries.push(Kept::of(entry));
        Some(self.entries.len() - 1)
    }

    /// Pins (or unpins) conversation `id`: a pinned one stays in memory past the budget.
    pub fn pin(
        &mut self,
        id: &str,
        pinned: bool,
        make_caches: &dyn Fn() -> Vec<KvCache>,
    ) -> Result<(), String> {
        let i = self
            .find(id, make_caches)
            .ok_or_else(|| no_conversation(id))?;
        self.entries[i].pinned = pinned;
        if !pinned {
            self.fit_budget();
        }
        Ok(())
    }

    /// Starts conversation `new` from the first `tokens` (default all) of conversation `id`:
    /// its caches share their arrays with `id`'s until either writes. Returns the tokens it
    /// holds.
    pub fn fork(
        &mut self,
        (id, new): (&str, &str),
        tokens: Option<usize>,
        make_caches: &dyn Fn() -> Vec<KvCache>,
    ) -> Result<usize, String> {
        let named = |c: &Option<String>| c.as_deref() == Some(new);
        let on_disk = (self.disk.as_mut())
            .is_some_and(|d| d.files().values().any(|i| named(&i.conversation)));
        if on_disk || self.entries.iter().any(|e| named(&e.owner.conversation)) {
            return Err(format!(
                "conversation {new:?} exists already: evict it first or pick another id"
            ));
        }
        let i = self
            .find(id, make_caches)
            .ok_or_else(|| no_conversation(id))?;
        let from = &self.entries[i];
        let at = tokens.unwrap_or(from.tokens.len());
        if at == 0 || at > from.tokens.len() {
            return Err(format!(
                "conversation {id:?} holds {} tokens: fork at 1 to that many",
                from.tokens.len()
            ));
        }
        let (mut caches, snapshots) = (from.caches.clone(), from.snapshots.clone());
        let next = from.tokens.get(at).copied();
        let draft = from.draft.clone().and_then(|d| d.cut_to(at, next));
        let drop = (from.tokens.len() - at) as i32;
        if cut_back(&mut caches, &snapshots, drop, at) != Some(at) {
            return Err(format!(
                "conversation {id:?} cannot be cut back to {at} tokens (a recurrent state with no \
                 snapshot there, or a sliding window that has wrapped): fork it whole"
            ));
        }
        let entry = Kept {
            caches,
            draft,
            tokens: from.tokens[..at].to_vec(),
            snapshots: snapshots.into_iter().filter(|s| s.positions < at).collect(),
            owner: Owner {
                adapter_on: from.owner.adapter_on,
                conversation: Some(new.to_owned()),
            },
            pinned: false,
            stored: false,
            read_for_use: false,
        };
        self.entries.push(entry);
        self.fit_budget();
        Ok(at)
    }

    /// Forgets conversation `id` (every conversation with `None`), in memory and on disk.
    /// Returns how many entries and files went.
    pub fn evict(&mut self, id: Option<&str>) -> usize {
        let named = |c: &Option<String>| id.is_none() || c.as_deref() == id;
        let before = self.entries.len();
        self.entries.retain(|e| !named(&e.owner.conversation));
        let mut gone = before - self.entries.len();
        if let Some(disk) = &mut self.disk {
            let files: Vec<String> = (disk.files().iter())
                .filter(|(_, i)| named(&i.conversation))
                .map(|(n, _)| n.clone())
                .collect();
            gone += files.len();
            files.iter().for_each(|n| disk.remove(n));
        }
        gone
    }
}

impl Drop for PromptCache {
    /// A resident unloaded, replaced or dropped at exit: its entries go to the disk tier.
    fn drop(&mut self) {
        self.spill_all();
    }
}

fn no_conversation(id: &str) -> String {
    format!("no kept conversation {id:?} for this model: `cache_list` shows those kept")
}

/// Cuts `caches` (holding `drop` more than `shared` positions) back to `shared`, or, where a
/// recurrent state cannot be cut back, to the latest snapshot within it. Returns where they
/// now end; `None` when neither works.
fn cut_back(
    caches: &mut [KvCache],
    snapshots: &[Snapshot],
    drop: i32,
    shared: usize,
) -> Option<usize> {
    if caches.iter_mut().all(|c| c.trim(drop)) {
        return Some(shared);
    }
    // The copy's other caches are cut back from wherever the trim above left them.
    let snapshot = snapshots.iter().rev().find(|s| s.positions <= shared)?;
    snapshot.restore(caches).then_some(snapshot.positions)
}

#[cfg(test)]
mod tests {
    use mlx_rs::Array;

    use super::*;
    use crate::layers::kv_cache::StateCache;
    use fixtures::mlx_test_lock;

    /// Two plain caches (or sliding-window ones) holding `n` positions.
    fn caches(n: i32, window: Option<i32>) -> Vec<KvCache> {
        (0..2)
            .map(|_| {
                let mut c = KvCache::for_window(window);
                if n > 0 {
                    let x = Array::from_slice(&vec![0f32; n as usize], &[1, 1, n, 1]);
                    c.update_and_fetch(x.clone(), x).unwrap();
                }
                c
            })
            .collect()
    }

    /// Computed with the adapter on, for no named conversation.
    fn on() -> Owner {
        Owner {
            adapter_on: true,
            conversation: None,
        }
    }

    fn off() -> Owner {
        Owner::default()
    }

    fn offsets(caches: &[KvCache]) -> Vec<i32> {
        caches.iter().map(KvCache::offset).collect()
    }

    #[test]
    fn a_longer_prompt_reuses_everything_kept() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        // Prompt 1..=4 then sampled 5, 6 fed back: 6 positions.
        cache.keep(
            (caches(6, None), Vec::new(), None),
            &[1, 2, 3, 4],
            &[5, 6],
            &on(),
        );
        let (c, reused, _, _) = cache.take(&[1, 2, 3, 4, 5, 6, 7, 8], (&on(), false), || {
            caches(0, None)
        });
        assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
    }

    #[test]
    fn the_same_prompt_leaves_its_last_token_to_run() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep(
            (caches(5, None), Vec::new(), None),
            &[1, 2, 3, 4, 5],
            &[],
            &on(),
        );
        let (c, reused, _, _) = cache.take(&[1, 2, 3, 4, 5], (&on(), false), || caches(0, None));
        assert_eq!((reused, offsets(&c)), (4, vec![4, 4]));
    }

    #[test]
    fn a_diverging_prompt_is_cut_back_to_the_shared_prefix() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep(
            (caches(6, None), Vec::new(), None),
            &[1, 2, 3, 4],
            &[5, 6],
            &on(),
        );
        let (c, reused, _, _) = cache.take(&[1, 2, 9, 9, 9], (&on(), false), || caches(0, None));
        assert_eq!((reused, offsets(&c)), (2, vec![2, 2]));
        // A copy was cut back: the entry still holds all six for its own conversation.
        let (c, reused, _, _) =
            cache.take(&[1, 2, 3, 4, 5, 6, 7], (&on(), false), || caches(0, None));
        assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
        // Taken whole: nothing is left to share.
        let (c, reused, _, _) = cache.take(&[1, 2, 9], (&on(), false), || caches(0, None));
        assert_eq!((reused, offsets(&c)), (0, vec![0, 0]));
    }

    #[test]
    fn writing_to_a_lent_copy_leaves_the_entry_as_it_was() {
        let _lock = mlx_test_lock();
        let ones = |n: i32| Array::from_slice(&vec![1f32; n as usize], &[1, 1, n, 1]);
        let mut c = KvCache::default();
        c.update_and_fetch(ones(4), ones(4)).unwrap();
        let mut cache = PromptCache::default();
        cache.keep((vec![c], Vec::new(), None), &[1, 2, 3, 4], &[], &on());
        let (mut copy, reused, _, _) = cache.take(&[1, 2, 9, 9], (&on(), false), Vec::new);
        assert_eq!(reused, 2);
        let nines = Array::from_slice(&[9f32; 2], &[1, 1, 2, 1]);
        copy[0].update_and_fetch(nines.clone(), nines).unwrap();
        let (mut kept, reused, _, _) = cache.take(&[1, 2, 3, 4, 5], (&on(), false), Vec::new);
        assert_eq!(reused, 4);
        let (keys, _) = kept[0].update_and_fetch(ones(1), ones(1)).unwrap();
        assert_eq!(keys.as_slice::<f32>(), &[1f32; 5]);
    }

    #[test]
    fn two_conversations_taking_turns_both_hit() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep((caches(4, None), Vec::new(), None), &[1, 2, 3], &[4], &on());
        cache.keep(
            (caches(4, None), Vec::new(), None),
            &[7, 8, 9],
            &[10],
            &on(),
        );
        let (c, reused, _, _) = cache.take(&[1, 2, 3, 4, 5, 6], (&on(), false), || caches(0, None));
        assert_eq!((reused, offsets(&c)), (4, vec![4, 4]));
        cache.keep(
            (caches(6, None), Vec::new(), None),
            &[1, 2, 3, 4, 5, 6],
            &[],
            &on(),
        );
        let (_, reused, _, _) = cache.take(&[7, 8, 9, 10, 11], (&on(), false), || caches(0, None));
        assert_eq!(reused, 4);
        let (_, reused, _, _) =
            cache.take(&[1, 2, 3, 4, 5, 6, 7], (&on(), false), || caches(0, None));
        assert_eq!(reused, 6);
    }

    #[test]
    fn the_longest_shared_prefix_wins_and_a_prefix_entry_is_replaced() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep((caches(3, None), Vec::new(), None), &[1, 2, 3], &[], &on());
        cache.keep((caches(3, None), Vec::new(), None), &[1, 5, 6], &[], &on());
        let (_, reused, _, _) = cache.take(&[1, 2, 3, 4], (&on(), false), || caches(0, None));
        assert_eq!(reused, 3);
        // [1, 2] starts [1, 2, 3, 4, 5]: the longer entry replaces it.
        cache.keep((caches(2, None), Vec::new(), None), &[1, 2], &[], &on());
        cache.keep(
            (caches(5, None), Vec::new(), None),
            &[1, 2, 3, 4, 5],
            &[],
            &on(),
        );
        assert_eq!(cache.entries.len(), 2);
    }

    #[test]
    fn the_least_recently_used_go_first_past_the_budget() {
        let _lock = mlx_test_lock();
        // One entry of caches(4): two layers of keys and values, 256 float32 positions each.
        let entry = 2 * 2 * 256 * 4;
        let mut cache = PromptCache::new(2 * entry);
        cache.keep(
            (caches(4, None), Vec::new(), None),
            &[1, 1, 1, 1],
            &[],
            &on(),
        );
        cache.keep(
            (caches(4, None), Vec::new(), None),
            &[2, 2, 2, 2],
            &[],
            &on(),
        );
        // Used: now the most recent.
        let (c, _, _, _) = cache.take(&[1, 1, 1, 9], (&on(), false), || caches(0, None));
        drop(c);
        cache.keep(
            (caches(4, None), Vec::new(), None),
            &[3, 3, 3, 3],
            &[],
            &on(),
        );
        let (_, reused, _, _) = cache.take(&[2, 2, 2, 2, 2], (&on(), false), || caches(0, None));
        assert_eq!(reused, 0, "the least recently used entry is gone");
        let (_, reused, _, _) = cache.take(&[1, 1, 1, 1, 1], (&on(), false), || caches(0, None));
        assert_eq!(reused, 4);
        // The newest stays even alone past the budget.
        let mut cache = PromptCache::new(1);
        cache.keep(
            (caches(4, None), Vec::new(), None),
            &[1, 1, 1, 1],
            &[],
            &on(),
        );
        let (_, reused, _, _) = cache.take(&[1, 1, 1, 1, 1], (&on(), false), || caches(0, None));
        assert_eq!(reused, 4);
    }

    #[test]
    fn positions_fed_but_never_read_are_cut_off() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        // A step queued ahead fed a 7th token whose id was never read.
        cache.keep(
            (caches(7, None), Vec::new(), None),
            &[1, 2, 3, 4],
            &[5, 6],
            &on(),
        );
        let (c, reused, _, _) = cache.take(&[1, 2, 3, 4, 5, 6, 7, 8], (&on(), false), || {
            caches(0, None)
        });
        assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
        // A prefill cancelled after 3 of 5 prompt tokens.
        cache.keep(
            (caches(3, None), Vec::new(), None),
            &[1, 2, 3, 4, 5],
            &[],
            &on(),
        );
        let (_, reused, _, _) = cache.take(&[1, 2, 3, 4, 5], (&on(), false), || caches(0, None));
        assert_eq!(reused, 3);
    }

    #[test]
    fn another_adapter_position_or_nothing_shared_starts_fresh() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep(
            (caches(4, None), Vec::new(), None),
            &[1, 2, 3, 4],
            &[],
            &on(),
        );
        let (_, reused, _, _) = cache.take(&[1, 2, 3, 4, 5], (&off(), false), || caches(0, None));
        assert_eq!(reused, 0);
        cache.keep(
            (caches(4, None), Vec::new(), None),
            &[1, 2, 3, 4],
            &[],
            &on(),
        );
        let (_, reused, _, _) = cache.take(&[7, 2, 3, 4, 5], (&on(), false), || caches(0, None));
        assert_eq!(reused, 0);
    }

    /// A hybrid model's caches: a linear-attention layer's state and a KV cache, `n` positions.
    fn hybrid(n: i32) -> Vec<KvCache> {
        let mut state = StateCache::default();
        state.advance(n);
        let mut c = caches(n, None);
        c[0] = KvCache::State(state);
        c
    }

    #[test]
    fn a_recurrent_state_is_reused_only_by_a_prompt_that_extends_it() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep((hybrid(6), Vec::new(), None), &[1, 2, 3, 4], &[5, 6], &on());
        let (c, reused, _, _) = cache.take(&[1, 2, 3, 4, 5, 6, 7], (&on(), false), || hybrid(0));
        assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
        // The same tokens again: the last one would have to be forgotten, so nothing is reused.
        cache.keep((hybrid(6), Vec::new(), None), &[1, 2, 3, 4], &[5, 6], &on());
        let (c, reused, _, _) = cache.take(&[1, 2, 3, 4, 5, 6], (&on(), false), || hybrid(0));
        assert_eq!((reused, offsets(&c)), (0, vec![0, 0]));
        // A diverging prompt: no shared prefix can be cut back to.
        cache.keep((hybrid(6), Vec::new(), None), &[1, 2, 3, 4], &[5, 6], &on());
        let (_, reused, _, _) = cache.take(&[1, 2, 3, 9, 9, 9, 9], (&on(), false), || hybrid(0));
        assert_eq!(reused, 0);
        // A step fed a token never read: the state holds it, so it is not kept at all.
        let mut cache = PromptCache::default();
        cache.keep((hybrid(7), Vec::new(), None), &[1, 2, 3, 4], &[5, 6], &on());
        let (_, reused, _, _) = cache.take(&[1, 2, 3, 4, 5, 6, 7, 8], (&on(), false), || hybrid(0));
        assert_eq!(reused, 0);
    }

    #[test]
    fn a_recurrent_state_resumes_from_its_latest_snapshot_within_the_shared_prefix() {
        let _lock = mlx_test_lock();
        let snapshot = |n| Snapshot::of(&hybrid(n), n as usize).unwrap().unwrap();
        let keep = |cache: &mut PromptCache| {
            let kept = (hybrid(6), vec![snapshot(2), snapshot(4)], None);
            cache.keep(kept, &[1, 2, 3, 4], &[5, 6], &on());
        };
        let mut cache = PromptCache::default();
        keep(&mut cache);
        // Shares 5 tokens: resumes at 4, the states as they were there, the others cut back.
        let (c, reused, within, _) = cache.take(&[1, 2, 3, 4, 5, 9], (&on(), false), || hybrid(0));
        assert_eq!((reused, offsets(&c)), (4, vec![4, 4]));
        assert_eq!(
            within.iter().map(|s| s.positions).collect::<Vec<_>>(),
            [2, 4]
        );
        // The entry is still whole for its own conversation, and shares 3 with this one.
        let (c, reused, within, _) = cache.take(&[1, 2, 3, 9], (&on(), false), || hybrid(0));
        assert_eq!((reused, offsets(&c), within.len()), (2, vec![2, 2], 1));
        // Nothing before the first snapshot: from scratch.
        let (_, reused, _, _) = cache.take(&[1, 9], (&on(), false), || hybrid(0));
        assert_eq!(reused, 0);
        // Extending it: all of it, and its snapshots go on with the caches.
        let (c, reused, within, _) =
            cache.take(&[1, 2, 3, 4, 5, 6, 7], (&on(), false), || hybrid(0));
        assert_eq!((reused, offsets(&c), within.len()), (6, vec![6, 6], 2));
    }

    #[test]
    fn a_request_that_is_not_kept_borrows_an_entry_it_extends_and_leaves_it() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        cache.keep(
            (caches(6, None), Vec::new(), None),
            &[1, 2, 3, 4],
            &[5, 6],
            &on(),
        );
        for _ in 0..2 {
            let (c, reused, _, _) =
                cache.take(&[1, 2, 3, 4, 5, 6, 7], (&on(), true), || caches(0, None));
            assert_eq!((reused, offsets(&c)), (6, vec![6, 6]));
        }
        let (_, reused, _, _) =
            cache.take(&[1, 2, 3, 4, 5, 6, 7], (&on(), false), || caches(0, None));
        assert_eq!(reused, 6);
        let (_, reused, _, _) =
            cache.take(&[1, 2, 3, 4, 5, 6, 7], (&on(), false), || caches(0, None));
        assert_eq!(reused, 0, "taken whole by a request that is kept");
    }

    #[test]
    fn a_wrapped_sliding_window_cannot_be_cut_back() {
        let _lock = mlx_test_lock();
        let mut cache = PromptCache::default();
        // Within its window of 8: trimmable.
        cache.keep(
            (caches(6, Some(8)), Vec::new(), None),
            &[1, 2, 3, 4, 5, 6],
            &[],
            &on(),
        );
        let (c, reused, _, _) = cache.take(&[1, 2, 3, 9], (&on(), false), || caches(0, Some(8)));
        assert_eq!((reused, offsets(&c)), (3, vec![3, 3]));
        // Past it: positions were overwritten, so only an exact continuation could reuse it.
        let prompt: Vec<u32> = (1..=10).collect();
        cache.keep((caches(10, Some(8)), Vec::new(), None), &prompt, &[], &on());
        let (c, reused, _, _) = cache.take(&[1, 2, 3, 9], (&on(), false), || caches(0, Some(8)));
        assert_eq!((reused, offsets(&c)), (0, vec![0, 0]));
    }

    /// A multi-token-prediction head's (or EAGLE-3's) last position read the token after it:
    /// its caches serve a prompt with that token there, not one with another; a block
    /// drafter's positions read nothing past themselves.
    #[test]
    fn a_heads_caches_serve_only_a_prompt_with_the_token_its_last_position_read() {
        let _lock = mlx_test_lock();
        let drafter = |drafter, n| {
            Some(DraftCaches {
                drafter,
                caches: caches(n, None),
                follows: None,
            })
        };
        let mut cache = PromptCache::default();
        // Prompt 1 2 3 4, sampled 5 6: the model ran five positions (6 not yet), the head too.
        let kept = (caches(5, None), Vec::new(), drafter(DrafterKey::Mtp, 5));
        cache.keep(kept, &[1, 2, 3, 4], &[5, 6], &on());
        let mut take = |prompt: &[u32]| {
            let (_, reused, _, draft) = cache.take(prompt, (&on(), true), || caches(0, None));
            (reused, draft.map(|d| d.offset()))
        };
        assert_eq!(take(&[1, 2, 3, 4, 5, 6, 7]), (5, Some(5)));
        assert_eq!(
            take(&[1, 2, 3, 4, 5, 9, 7]),
            (5, None),
            "another token after them"
        );
        assert_eq!(
            take(&[1, 2, 3, 9, 9]),
            (3, None),
            "its third position read 4, not 9"
        );
        let mut cache = PromptCache::default();
        let kept = (caches(5, None), Vec::new(), drafter(DrafterKey::Block, 5));
        cache.keep(kept, &[1, 2, 3, 4], &[5, 6], &on());
        let (_, reused, _, draft) = cache.take(&[1, 2, 3, 9, 9], (&on(), true), || caches(0, None));
        assert_eq!((reused, draft.map(|d| d.offset())), (3, Some(3)));
    }
}
