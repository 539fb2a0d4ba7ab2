//! The engine's floors, kept as `lib.rs` describes them (rust-analyzer's tidy tests read the
//! sources the same way): every file imports only from its own floor or the floors below, and no
//! two files import each other, directly or round a circle.
//!
//! Imports are the paths a file names: `crate::a::b`, `super::a`, and a `mod.rs`'s own children
//! (`padded::PaddedCache`). A path names the deepest module file it reaches.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// Floors from the bottom: a file's floor is that of the first directory (or root file) of its
/// path. `lib.rs` declares everything and is above them all.
const FLOORS: &[&[&str]] = &[
    &["error.rs"],
    &["layers"],
    &["models", "vision"],
    &["runtime"],
    &["lib.rs", "floors_tests.rs"],
];

fn floor(file: &str) -> usize {
    let top = file.split('/').next().unwrap_or(file);
    (FLOORS.iter().position(|f| f.contains(&top)))
        .unwrap_or_else(|| panic!("{file}: not on a floor; add `{top}` to FLOORS"))
}

struct Sources {
    /// Path relative to `src/` -> text without comments.
    files: BTreeMap<String, String>,
    /// Module path -> file.
    modules: BTreeMap<Vec<String>, String>,
    /// What `lib.rs` re-exports at the crate root: name -> the file it comes from.
    reexports: BTreeMap<String, String>,
    /// Files `lib.rs` re-exports everything of (`pub use a::*`).
    globs: Vec<String>,
}

fn read(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path: PathBuf = entry.unwrap().path();
        if path.is_dir() {
            read(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&path).unwrap();
            let code: Vec<&str> = text
                .lines()
                .map(|l| l.split("//").next().unwrap())
                .collect();
            out.insert(rel, code.join("\n"));
        }
    }
}

fn module_path(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

impl Sources {
    fn load() -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = BTreeMap::new();
        read(&root, &root, &mut files);
        let modules = files.keys().map(|f| (module_path(f), f.clone())).collect();
        let mut sources = Self {
            files,
            modules,
            reexports: BTreeMap::new(),
            globs: Vec::new(),
        };
        sources.read_reexports();
        sources
    }

    /// `lib.rs`'s `pub use` lines: `crate::Engine` in a file names `runtime/engine.rs`.
    fn read_reexports(&mut self) {
        let lib = self.files["lib.rs"].clone();
        for (at, _) in lib.match_indices("pub use ") {
            let rest = &lib[at + "pub use ".len()..];
            let rest = &rest[..rest.find(';').unwrap_or(rest.len())];
            if let Some(module) = rest.trim_end().strip_suffix("::*") {
                let glob = expand(module).pop().and_then(|p| self.resolve(&p).cloned());
                self.globs.extend(glob);
                continue;
            }
            for path in expand(rest) {
                let Some(file) = self.resolve(&path).cloned() else {
                    continue; // another crate's (`pub use text;`)
                };
                match path.last().map(String::as_str) {
                    None => {}
                    Some(name) => {
                        // `X as Y`: the name is the alias.
                        let name = rest
                            .split(&format!("{name} as "))
                            .nth(1)
                            .map(|a| a.split(|c: char| !c.is_alphanumeric() && c != '_'))
                            .and_then(|mut a| a.next())
                            .unwrap_or(name);
                        self.reexports.insert(name.to_string(), file);
                    }
                }
            }
        }
    }

    /// The deepest module file `path` (from the crate root) reaches; a root item through
    /// `lib.rs`'s re-exports.
    fn resolve(&self, path: &[String]) -> Option<&String> {
        let module = (1..=path.len())
            .rev()
            .find_map(|n| self.modules.get(&path[..n]));
        if module.is_some() || path.len() > 1 {
            return module;
        }
        let name = path.first()?;
        (self.reexports.get(name)).or_else(|| self.globs.first().filter(|_| is_type(name)))
    }

    /// Files `file` imports.
    fn imports(&self, file: &str) -> BTreeSet<String> {
        let text = &self.files[file];
        let me = module_path(file);
        let is_dir_module = file.ends_with("mod.rs") || file == "lib.rs";
        let parent: Vec<String> = match is_dir_module {
            true => me[..me.len().saturating_sub(1)].to_vec(),
            false => me[..me.len() - 1].to_vec(),
        };
        let mut out = BTreeSet::new();
        let mut add = |base: &[String], rest: &str| {
            for path in expand(rest) {
                let mut full = base.to_vec();
                full.extend(path);
                if let Some(f) = self.resolve(&full).filter(|f| *f != file) {
                    out.insert(f.clone());
                }
            }
        };
        for (at, _) in text.match_indices("crate::") {
            add(&[], &text[at + "crate::".len()..]);
        }
        // An inline `mod tests`'s `super::` is the file itself.
        let tests_at = text.find("mod tests {").unwrap_or(text.len());
        for (at, _) in text.match_indices("super::") {
            if !preceded_by_path(text, at) && at < tests_at {
                let (mut base, mut rest) = (parent.clone(), &text[at + "super::".len()..]);
                while let Some(more) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = more;
                }
                add(&base, rest);
            }
        }
        for (at, _) in text.match_indices("self::") {
            if !preceded_by_path(text, at) && !preceded_by_ident(text, at) {
                add(&me, &text[at + "self::".len()..]);
            }
        }
        // A directory module naming its children by bare paths.
        for (child, child_file) in &self.modules {
            if child.len() == me.len() + 1 && child.starts_with(&me) && child_file != file {
                let name = format!("{}::", child.last().unwrap());
                let named = text
                    .match_indices(&name)
                    .any(|(at, _)| !preceded_by_path(text, at) && !preceded_by_ident(text, at));
                if named {
                    out.insert(child_file.clone());
                }
            }
        }
        out
    }
}

/// A type's name (`Engine`), not a function's or a module's.
fn is_type(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_uppercase())
}

fn preceded_by_path(text: &str, at: usize) -> bool {
    text[..at].ends_with("::")
}

fn preceded_by_ident(text: &str, at: usize) -> bool {
    (text[..at].chars().last()).is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// The paths at the start of `rest`: `a::b::C` or `{a::B, c::{D, E}}`, as segment lists (a
/// group's items each as one path; only module segments matter).
fn expand(rest: &str) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    let mut s = rest;
    loop {
        if let Some(group) = s.strip_prefix('{') {
            let end = matching_brace(group);
            let mut out = Vec::new();
            let items = split_top_level(&group[..end]);
            for item in items.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
                for tail in expand(item) {
                    let mut path = segments.clone();
                    path.extend(tail);
                    out.push(path);
                }
            }
            return out;
        }
        let len = s
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        if len == 0 {
            break;
        }
        segments.push(s[..len].to_string());
        match s[len..].strip_prefix("::") {
            Some(next) => s = next,
            None => break,
        }
    }
    vec![segments]
}

fn matching_brace(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    s.len()
}

fn split_top_level(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

#[test]
fn no_file_imports_from_a_higher_floor() {
    let sources = Sources::load();
    let mut wrong = Vec::new();
    for file in sources.files.keys() {
        for import in sources.imports(file) {
            if floor(&import) > floor(file) {
                wrong.push(format!("{file} imports {import}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports up a floor:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_import_circle() {
    let sources = Sources::load();
    let graph: BTreeMap<&String, BTreeSet<String>> = sources
        .files
        .keys()
        .map(|f| (f, sources.imports(f)))
        .collect();
    // A file on a circle reaches itself: the shortest way round, by breadth first search.
    let mut circles = Vec::new();
    for start in graph.keys() {
        let mut from: BTreeMap<String, String> = BTreeMap::new();
        let mut todo = std::collections::VecDeque::from([(*start).clone()]);
        while let Some(f) = todo.pop_front() {
            for next in &graph[&f] {
                if !from.contains_key(next) {
                    from.insert(next.clone(), f.clone());
                    todo.push_back(next.clone());
                }
            }
        }
        if let Some(mut at) = from.get(*start).cloned() {
            let mut way = vec![(*start).clone()];
            while at != **start {
                way.push(at.clone());
                at = from[&at].clone();
            }
            way.push((*start).clone());
            way.reverse();
            circles.push(way.join(" -> "));
        }
    }
    assert!(
        circles.is_empty(),
        "files on an import circle:\n{}",
        circles.join("\n")
    );
}

#[test]
fn paths_are_read_as_written() {
    let got = expand("{a::B, c::{D, e::F}};");
    let want = [vec!["a", "B"], vec!["c", "D"], vec!["c", "e", "F"]];
    let want: Vec<Vec<String>> = want
        .iter()
        .map(|p| p.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        expand("layers::sdpa::sdpa(&q)"),
        [["layers", "sdpa", "sdpa"].map(String::from).to_vec()]
    );
}
