//! End-to-end: the prompt cache's disk tier (`--disk-cache-bytes`). A conversation's caches
//! leave memory for the disk at exit and come back after a restart (the next turn reuses them
//! and answers as a fresh worker does); a request not to keep never reaches the disk; a damaged
//! or foreign file is deleted, never used; two workers on one directory lose nothing.

use std::path::{Path, PathBuf};

use crate::support::{
    self, import_cache, model_id, tiny_model, within, within_for, worker, worker_in,
};
use fixtures::TinyLlama;
use protocol::methods::*;
use protocol::Client;

const DISK: &[&str] = &["--disk-cache-bytes", "1000000000"];

fn chat(turns: &[(&str, &str)]) -> GenerateParams {
    support::chat(turns, 12)
}

/// The first question, its answer, and the next question.
fn next_turn(answer: &str) -> [(&'static str, &str); 3] {
    [
        ("user", "Name three colours."),
        ("assistant", answer),
        ("user", "And three more?"),
    ]
}

async fn ask(w: &Client, p: &GenerateParams) -> GenerateResult {
    within(w.generate(p).unwrap().finish()).await.unwrap()
}

async fn load(w: &Client, model: &Path) {
    within(w.call::<Load>(&LoadParams::new(model_id(model))))
        .await
        .unwrap();
}

/// A worker on `cache` with the disk tier on (of `DISK`'s size unless `args` give one), `model`
/// loaded.
async fn disk_worker(cache: &Path, model: &Path, args: &[&str]) -> Client {
    let sized = args.contains(&"--disk-cache-bytes");
    let args: Vec<&str> = DISK
        .iter()
        .filter(|_| !sized)
        .chain(args)
        .copied()
        .collect();
    let w = worker_in(cache, &args);
    load(&w, model).await;
    w
}

/// The tier's files, every model's.
fn files(cache: &Path) -> Vec<PathBuf> {
    let dirs = std::fs::read_dir(cache.join("prompt-cache"))
        .into_iter()
        .flatten()
        .flatten();
    let inner = dirs.flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten());
    let mut files: Vec<PathBuf> = inner
        .map(|f| f.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    files
}

async fn disk_status(w: &Client) -> DiskTierInfo {
    let status = support::settled_status(w).await;
    status.prompt_cache.disk.expect("the disk tier is on")
}

/// A fresh worker without the disk tier: what a cold run answers.
async fn cold(model: &Path, p: &GenerateParams) -> GenerateResult {
    let w = worker(&[]);
    load(&w, model).await;
    let answer = ask(&w, p).await;
    assert_eq!(answer.usage.cached_tokens, 0);
    w.shutdown().await.unwrap();
    answer
}

#[tokio::test]
async fn a_conversation_resumes_from_disk_after_a_restart() {
    let (cache, model) = (import_cache(), tiny_model(&TinyLlama::default()));
    let w = disk_worker(cache.path(), model.path(), &[]).await;
    let first = ask(&w, &chat(&[("user", "Name three colours.")])).await;
    assert!(
        files(cache.path()).is_empty(),
        "in memory until it leaves it"
    );
    w.shutdown().await.unwrap();
    assert_eq!(files(cache.path()).len(), 1, "written at exit");

    let turns = next_turn(&first.text);
    let w = disk_worker(cache.path(), model.path(), &[]).await;
    let second = ask(&w, &chat(&turns)).await;
    let held = first.usage.prompt_tokens + first.usage.completion_tokens;
    assert!(
        second.usage.cached_tokens >= first.usage.prompt_tokens
            && second.usage.cached_tokens <= held,
        "{:?} after {:?}",
        second.usage,
        first.usage
    );
    assert_eq!(
        second.timings.prompt_n,
        second.usage.prompt_tokens - second.usage.cached_tokens
    );
    let disk = disk_status(&w).await;
    assert_eq!(
        (disk.tier.hits, disk.tier.hit_tokens),
        (1, second.usage.cached_tokens)
    );
    assert_eq!(disk.rejected, 0);
    assert_eq!(cold(model.path(), &chat(&turns)).await.text, second.text);

    // The file read back stays; at exit the longer conversation replaces it.
    w.shutdown().await.unwrap();
    let after = files(cache.path());
    assert_eq!(after.len(), 1, "{after:?}");
}

#[tokio::test]
async fn a_request_not_to_keep_never_reaches_the_disk() {
    let (cache, model) = (import_cache(), tiny_model(&TinyLlama::default()));
    let w = disk_worker(cache.path(), model.path(), &["--prompt-cache-bytes", "0"]).await;
    for text in ["Name three colours.", "Count to five."] {
        let mut p = chat(&[("user", text)]);
        p.cache = Some(CacheParams {
            persist: false,
            conversation_id: None,
        });
        ask(&w, &p).await;
    }
    w.shutdown().await.unwrap();
    assert_eq!(files(cache.path()), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn a_damaged_or_foreign_file_is_deleted_not_used() {
    let (cache, model) = (import_cache(), tiny_model(&TinyLlama::default()));
    let w = disk_worker(cache.path(), model.path(), &[]).await;
    let first = ask(&w, &chat(&[("user", "Name three colours.")])).await;
    w.shutdown().await.unwrap();
    let [file] = &files(cache.path())[..] else {
        panic!("one file: {:?}", files(cache.path()))
    };
    // One byte of the arrays flipped, and a file that is no safetensors at all beside it.
    let mut bytes = std::fs::read(file).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x40;
    std::fs::write(file, &bytes).unwrap();
    let junk = file.with_file_name("junk.safetensors");
    std::fs::write(&junk, b"not a cache").unwrap();

    let turns = next_turn(&first.text);
    let w = disk_worker(cache.path(), model.path(), &[]).await;
    let second = ask(&w, &chat(&turns)).await;
    assert_eq!(second.usage.cached_tokens, 0, "{:?}", second.usage);
    assert_eq!(second.text, cold(model.path(), &chat(&turns)).await.text);
    let disk = disk_status(&w).await;
    assert_eq!((disk.rejected, disk.tier.hits), (2, 0));
    assert!(
        !file.exists() && !junk.exists(),
        "{:?}",
        files(cache.path())
    );
    w.shutdown().await.unwrap();

    // A file of another model (here: the model as it was before its weights changed) found
    // among this model's files is foreign.
    let [old] = &files(cache.path())[..] else {
        panic!("one file: {:?}", files(cache.path()))
    };
    let foreign = std::fs::read(old).unwrap();
    let weights = model.path().join("model.safetensors");
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    let file = std::fs::File::options().write(true).open(&weights).unwrap();
    file.set_modified(later).unwrap();
    let w = disk_worker(cache.path(), model.path(), &[]).await;
    ask(&w, &chat(&[("user", "Count to five.")])).await;
    w.shutdown().await.unwrap();
    let new_dir = (files(cache.path()).iter())
        .map(|f| f.parent().unwrap().to_owned())
        .find(|d| d != old.parent().unwrap())
        .expect("the changed model's files have a directory of their own");
    let planted = new_dir.join("planted.safetensors");
    std::fs::write(&planted, foreign).unwrap();
    let w = disk_worker(cache.path(), model.path(), &[]).await;
    ask(&w, &chat(&turns)).await;
    assert_eq!(disk_status(&w).await.rejected, 1);
    assert!(!planted.exists());
    w.shutdown().await.unwrap();
}

/// Two workers on one directory, each keeping only its newest conversation in memory (so every
/// turn pushes the one before to disk) under a disk budget of about two files (so each write
/// deletes files, some the other worker is about to read): every answer is the cold answer, and
/// every file left is whole.
#[tokio::test]
async fn two_workers_on_one_directory_lose_nothing() {
    let (cache, model) = (import_cache(), tiny_model(&TinyLlama::default()));
    // A tiny Llama conversation's file: its caches' 256-position storage, about 0.13 MB.
    let args = ["--prompt-cache-bytes", "0", "--disk-cache-bytes", "300000"];
    let (a, b) = (
        disk_worker(cache.path(), model.path(), &args).await,
        disk_worker(cache.path(), model.path(), &args).await,
    );
    const TOPICS: [&str; 4] = ["colours", "numbers", "animals", "rivers"];
    let run = |w: Client, mine: &'static [&'static str]| async move {
        let mut answers = Vec::new();
        for round in 0..2 {
            for topic in mine {
                let mut turns = vec![("user".to_owned(), format!("Tell me about {topic}."))];
                if round == 1 {
                    let first = ask(&w, &chat_of(&turns)).await;
                    turns.push(("assistant".to_owned(), first.text));
                    turns.push(("user".to_owned(), "More.".to_owned()));
                }
                let answer = ask(&w, &chat_of(&turns)).await;
                answers.push((turns, answer));
            }
        }
        w.shutdown().await.unwrap();
        answers
    };
    let (from_a, from_b) = within_for(std::time::Duration::from_secs(120), async {
        tokio::join!(run(a, &TOPICS[..2]), run(b, &TOPICS[2..]))
    })
    .await;
    let fresh = worker(&[]);
    load(&fresh, model.path()).await;
    for (turns, answer) in from_a.iter().chain(&from_b) {
        let cold = ask(&fresh, &chat_of(turns)).await;
        assert_eq!(answer.text, cold.text, "{turns:?}");
    }
    fresh.shutdown().await.unwrap();
    let left = files(cache.path());
    assert!((1..=2).contains(&left.len()), "{left:?}");
    // A third worker reads every file left, and rejects none.
    let c = disk_worker(cache.path(), model.path(), &[]).await;
    let listed = within(c.call::<CacheList>(&CacheListParams::default()))
        .await
        .unwrap();
    assert_eq!(listed.conversations.len(), left.len(), "{listed:?}");
    for (turns, _) in from_a.iter().chain(&from_b) {
        ask(&c, &chat_of(turns)).await;
    }
    assert_eq!(disk_status(&c).await.rejected, 0);
    c.shutdown().await.unwrap();
}

fn chat_of(turns: &[(String, String)]) -> GenerateParams {
    let turns: Vec<(&str, &str)> = turns
        .iter()
        .map(|(r, c)| (r.as_str(), c.as_str()))
        .collect();
    chat(&turns)
}

/// Named conversations holding the same tokens (a fork) keep a file each, and come back by name
/// after a restart.
#[tokio::test]
async fn named_conversations_keep_their_own_files() {
    let (cache, model) = (import_cache(), tiny_model(&TinyLlama::default()));
    let w = disk_worker(cache.path(), model.path(), &[]).await;
    let mut p = chat(&[("user", "Name three colours.")]);
    p.cache = Some(CacheParams {
        persist: true,
        conversation_id: Some("a".into()),
    });
    ask(&w, &p).await;
    let fork = CacheForkParams {
        model: None,
        conversation_id: "a".into(),
        new_conversation_id: "b".into(),
        tokens: None,
    };
    within(w.call::<CacheFork>(&fork)).await.unwrap();
    w.shutdown().await.unwrap();
    assert_eq!(files(cache.path()).len(), 2);

    let w = disk_worker(cache.path(), model.path(), &[]).await;
    let listed = within(w.call::<CacheList>(&CacheListParams::default()))
        .await
        .unwrap();
    let mut on_disk: Vec<_> = (listed.conversations.iter())
        .map(|c| (c.conversation_id.clone().unwrap(), c.tier))
        .collect();
    on_disk.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        on_disk,
        [("a".into(), CacheTier::Disk), ("b".into(), CacheTier::Disk)]
    );
    let pin = CachePinParams {
        model: None,
        conversation_id: "b".into(),
        pinned: true,
    };
    within(w.call::<CachePin>(&pin)).await.unwrap();
    let evict = CacheEvictParams {
        model: None,
        conversation_id: Some("a".into()),
    };
    assert_eq!(
        within(w.call::<CacheEvict>(&evict)).await.unwrap().evicted,
        1
    );
    w.shutdown().await.unwrap();
    assert_eq!(files(cache.path()).len(), 1);
}
