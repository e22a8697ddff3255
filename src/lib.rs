//! zonegate: a multi-zone, active-active AI inference gateway.
//!
//! The folders are the planes: `dataplane` (the request path) reads an
//! immutable route table and the control plane's latest `ClusterView` and
//! never waits on the control plane; `health` scores backends; `admin` is
//! the operators' API; `node` starts a node and holds its shared state;
//! `provider` translates to and from commercial APIs' wire formats;
//! `cli` and `tools` are the other subcommands. See ARCHITECTURE.md.

pub mod admin;
pub mod cli;
pub mod clock;
pub mod config;
pub mod dataplane;
pub mod health;
pub mod node;
pub mod provider;
pub mod telemetry;
pub mod tools;

/// Files that hold one idea (issue 43, item 4): no source file of these
/// crates has more than [`MAX_LINES`](source_files::MAX_LINES) lines of
/// non-test code. Adding a crate is one line in `ROOTS`.
#[cfg(test)]
mod source_files {
    use std::path::{Path, PathBuf};

    /// The source folders held to the limit, from the workspace root.
    const ROOTS: &[&str] = &["src", "net/src", "cluster/src", "chaos/src"];

    pub(super) const MAX_LINES: usize = 1_000;

    /// Lines of non-test code: those before the first `#[cfg(test)]` line.
    fn non_test_lines(text: &str) -> usize {
        text.lines()
            .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
            .count()
    }

    /// Every `.rs` file under `dir`, but in a `target` folder.
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    sources(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The non-test source files under [`ROOTS`] (a module's `tests.rs`
    /// is test code moved beside it), and the workspace root.
    fn non_test_sources() -> (&'static Path, Vec<PathBuf>) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        for dir in ROOTS {
            sources(&root.join(dir), &mut files);
        }
        files.retain(|path| path.file_name().is_some_and(|n| n != "tests.rs"));
        (root, files)
    }

    #[test]
    fn no_source_file_holds_more_than_a_thousand_lines_of_non_test_code() {
        let (root, files) = non_test_sources();
        assert!(files.len() > 10, "found only {files:?}");
        let over: Vec<String> = files
            .iter()
            .filter_map(|path| {
                let text = std::fs::read_to_string(path)
                    .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
                let n = non_test_lines(&text);
                (n > MAX_LINES).then(|| {
                    let rel = path.strip_prefix(root).unwrap_or(path);
                    format!("{} has {n} lines of non-test code", rel.display())
                })
            })
            .collect();
        assert!(
            over.is_empty(),
            "files over {MAX_LINES} lines of non-test code (split them by responsibility): {over:?}"
        );
    }

    /// The workspace denies `unsafe` (Cargo.toml's lints), and only an
    /// attribute naming the lint lets any through: one does, for glibc's
    /// `malloc_trim` in `node/heap.rs`, and no other may join it unseen,
    /// in any form (`allow`, `expect`, `warn`, a list) or any Rust file of
    /// the workspace's packages (their tests, benches and examples too).
    #[test]
    fn the_only_unsafe_is_the_heap_trim() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        for dir in [
            "src", "tests", "benches", "examples", "net", "cluster", "chaos",
        ] {
            sources(&root.join(dir), &mut files);
        }
        let lint = concat!("unsafe", "_code");
        let allowed: Vec<String> = files
            .iter()
            .flat_map(|path| {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                let rel = path
                    .strip_prefix(root)
                    .unwrap_or(path)
                    .display()
                    .to_string();
                std::iter::repeat_n(rel, text.matches(lint).count())
            })
            .collect();
        assert_eq!(allowed, ["src/node/heap.rs"]);
    }

    #[test]
    fn non_test_lines_stop_at_the_first_test_module() {
        assert_eq!(non_test_lines("a\nb\n#[cfg(test)]\nmod tests {}\n"), 2);
        assert_eq!(non_test_lines("a\nb\n"), 2);
    }
}
