//! The user guide (`docs/`, an mdBook) cannot drift from the code:
//! the `zonegate ctl` reference is the CLI's own help, every relative
//! link in the guide, README.md and the ARCHITECTURE.md files points to a file that
//! exists and, with `#anchor`, to a heading in it, and no link of the
//! built guide leaves it (the book holds docs/src only).
//!
//! `ZONEGATE_UPDATE_DOCS=1 cargo test --test docs` rewrites
//! `docs/src/ctl.md` from the binary's help.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `zonegate <args> --help`, free of the caller's environment.
fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_zonegate"))
        .args(args)
        .arg("--help")
        .env_remove("ZONEGATE_ADMIN")
        .env_remove("ZONEGATE_ADMIN_TOKEN")
        .env_remove("COLUMNS")
        .env("NO_COLOR", "1")
        .output()
        .expect("run zonegate");
    assert!(
        out.status.success(),
        "zonegate {args:?} --help failed: {out:?}"
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The subcommands a help text lists under `Commands:` (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

fn render_ctl(out: &mut String, path: &mut Vec<String>) {
    let args: Vec<&str> = path.iter().map(String::as_str).collect();
    let text = help(&args);
    let level = if path.len() <= 1 { "#" } else { "##" };
    out.push_str(&format!(
        "{level} `zonegate {}`\n\n```text\n",
        args.join(" ")
    ));
    out.push_str(text.trim_end());
    out.push_str("\n```\n\n");
    for sub in subcommands(&text) {
        path.push(sub);
        render_ctl(out, path);
        path.pop();
    }
}

fn ctl_reference() -> String {
    let mut out = String::from(
        "<!-- Generated from the CLI's help by tests/docs.rs \
         (ZONEGATE_UPDATE_DOCS=1 cargo test --test docs); do not edit. -->\n\n",
    );
    // The exit codes are in `ctl --help` itself.
    render_ctl(&mut out, &mut vec!["ctl".to_owned()]);
    out
}

#[test]
fn ctl_reference_is_the_clis_help() {
    let path = root().join("docs/src/ctl.md");
    let want = ctl_reference();
    if std::env::var_os("ZONEGATE_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = read(&path);
    assert!(
        have == want,
        "{} differs from `zonegate ctl ... --help`: regenerate it with \
         ZONEGATE_UPDATE_DOCS=1 cargo test --test docs ctl_reference",
        path.display()
    );
}

/// Markdown without fenced code blocks and code spans (links in code
/// are not links).
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut in_code = false;
        for part in line.split('`') {
            if !in_code {
                out.push_str(part);
            }
            in_code = !in_code;
        }
        out.push('\n');
    }
    out
}

/// GitHub's and mdBook's anchor of a heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of `[text](target)` links.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    prose
        .match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &prose[i + 2..];
            let end = rest.find(')')?;
            Some(
                rest[..end]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_owned(),
            )
        })
        .collect()
}

fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "cluster/ARCHITECTURE.md",
        "net/ARCHITECTURE.md",
        "src/dataplane/ARCHITECTURE.md",
    ]
    .iter()
    .map(|p| root().join(p))
    .collect();
    let src = root().join("docs/src");
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(&src)
        .unwrap_or_else(|e| panic!("{}: {e}", src.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    chapters.sort();
    docs.extend(chapters);
    docs
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        for target in links(&text) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            if !dest.exists() {
                broken.push(format!("{}: {target}: no such file", doc.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if dest.extension().is_some_and(|x| x == "md")
                    && !anchors(&rendered(&dest)).contains(anchor)
                {
                    broken.push(format!("{}: {target}: no such heading", doc.display()));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// A page as mdBook renders it: each `{{#include PATH}}` or
/// `{{#include PATH:ANCHOR}}` line replaced by the text it names.
fn rendered(page: &Path) -> String {
    let mut out = String::new();
    for line in read(page).lines() {
        let spec = line
            .trim()
            .strip_prefix("{{#include ")
            .and_then(|rest| rest.strip_suffix("}}"));
        match spec {
            Some(spec) => {
                let (file, anchor) = match spec.trim().split_once(':') {
                    Some((f, a)) => (f, Some(a)),
                    None => (spec.trim(), None),
                };
                let text = read(&page.parent().unwrap().join(file));
                match anchor {
                    Some(name) => out.push_str(&anchored(&text, name)),
                    None => out.push_str(&text),
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The lines between `ANCHOR: name` and `ANCHOR_END: name` (mdBook's
/// include anchors, e.g. in HTML comments).
fn anchored(text: &str, name: &str) -> String {
    let (start, end) = (format!("ANCHOR: {name} "), format!("ANCHOR_END: {name} "));
    let marks = |l: &str, m: &str| format!("{} ", l.trim()).contains(m);
    let lines: Vec<&str> = text
        .lines()
        .skip_while(|l| !marks(l, &start))
        .skip(1)
        .take_while(|l| !marks(l, &end))
        .collect();
    assert!(
        !lines.is_empty(),
        "no text between ANCHOR: {name} and ANCHOR_END: {name}"
    );
    lines.join("\n")
}

/// The built book holds docs/src only: a link of a chapter (or of the text
/// it includes) to a file outside docs/src is broken in the HTML, even
/// when it resolves in the Markdown.
#[test]
fn no_link_in_the_built_guide_leaves_it() {
    let src = root().join("docs/src").canonicalize().unwrap();
    let mut broken = Vec::new();
    let mut checked = 0;
    for chapter in documents().into_iter().skip(5) {
        for target in links(&rendered(&chapter)) {
            if target.is_empty()
                || target.starts_with('#')
                || target.contains("://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let name = chapter.file_name().unwrap().to_string_lossy();
            match src.join(file).canonicalize() {
                Err(_) => broken.push(format!("{name}: {target}: no such file in docs/src")),
                Ok(dest) if !dest.starts_with(&src) => broken.push(format!(
                    "{name}: {target}: outside docs/src, so not in the built book \
                     (link a chapter, or name the file without a link)"
                )),
                Ok(dest) => {
                    if let Some(anchor) = anchor {
                        if !anchors(&rendered(&dest)).contains(anchor) {
                            broken.push(format!("{name}: {target}: no such heading"));
                        }
                    }
                }
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} links found: is the parser broken?"
    );
    assert!(
        broken.is_empty(),
        "links broken in the built guide:\n{}",
        broken.join("\n")
    );
}

#[test]
fn included_text_is_cut_at_its_anchors() {
    let text = "a\n<!-- ANCHOR: tour -->\nb\nc\n<!-- ANCHOR_END: tour -->\nd\n";
    assert_eq!(anchored(text, "tour"), "b\nc");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("inc.md"), text).unwrap();
    std::fs::write(
        dir.path().join("page.md"),
        "# P\n{{#include inc.md:tour}}\n",
    )
    .unwrap();
    assert_eq!(rendered(&dir.path().join("page.md")), "# P\nb\nc\n");
}

#[test]
fn the_link_check_catches_a_broken_link_and_anchor() {
    let text = "# A `b` c!\n\n[x](#a-b-c) [y](#nope) `[z](#code)`\n```\n[w](#fenced)\n```\n";
    assert_eq!(links(text), vec!["#a-b-c", "#nope"]);
    assert!(anchors(text).contains("a-b-c"));
    assert!(!anchors(text).contains("nope"));
}

/// Every chapter is in the book's table of contents.
#[test]
fn every_chapter_is_in_the_summary() {
    let summary = read(&root().join("docs/src/SUMMARY.md"));
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    for doc in documents().into_iter().skip(5) {
        let name = doc.file_name().unwrap().to_string_lossy().into_owned();
        if name != "SUMMARY.md" {
            assert!(
                listed.contains(&name),
                "docs/src/SUMMARY.md does not list {name}"
            );
        }
    }
}

/// Every user-facing document: README, SECURITY, the guide, deploy/,
/// config/ and the drill's README.
fn user_documents() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| {
                ["md", "yaml", "yml", "toml", "service", "timer", "env"]
                    .iter()
                    .any(|x| e == *x)
            }) {
                out.push(path);
            }
        }
    }
    let r = root();
    let mut out: Vec<PathBuf> = ["README.md", "SECURITY.md", "chaos/README.md"]
        .iter()
        .map(|f| r.join(f))
        .collect();
    for dir in ["docs/src", "deploy", "config"] {
        walk(&r.join(dir), &mut out);
    }
    out
}

/// A document that says a shipped feature is not built yet misleads the
/// first reader who believes it (deploy/README kept the drill "suspended
/// until `zonegate drill` exists" long after it shipped).
#[test]
fn no_document_calls_a_feature_unbuilt_with_a_phrase_for_the_future() {
    const PHRASES: &[&str] = &[
        "not built yet",
        "not yet built",
        "once built",
        "is a later issue",
        "fixed by config",
        "will make this one change",
    ];
    let mut found = Vec::new();
    for path in user_documents() {
        let text = read(&path).to_lowercase();
        for (n, line) in text.lines().enumerate() {
            let until_exists = line
                .find("until ")
                .is_some_and(|i| line[i..].contains(" exists") || line[i..].contains(" ships"));
            for p in PHRASES
                .iter()
                .filter(|p| line.contains(**p))
                .copied()
                .chain(until_exists.then_some("until … exists"))
            {
                found.push(format!("{}:{}: {p:?}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "documents that call a built feature unbuilt (say what it does today):\n{}",
        found.join("\n")
    );
}

/// The `N.NN×` ratios of a text, as written.
fn ratios(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    for (i, _) in text.match_indices('×') {
        let mut start = i;
        while start > 0 && (b[start - 1].is_ascii_digit() || b[start - 1] == b'.') {
            start -= 1;
        }
        if start < i {
            out.push(text[start..i].to_owned());
        }
    }
    out
}

/// One performance story: every ratio the README and the comparison page
/// state is the Performance chapter's "Where it stands", which agrees with
/// the chapter's latest measurement.
#[test]
fn the_readme_and_the_comparison_tell_the_performance_chapters_story() {
    let perf = read(&root().join("docs/src/performance.md"));
    let stands = perf
        .split("\n\n")
        .find(|p| p.starts_with("Where it stands"))
        .expect("performance.md has a \"Where it stands\" paragraph");
    let stands_ratios = ratios(stands);
    for f in ["README.md", "docs/src/compared.md"] {
        let text = read(&root().join(f));
        assert!(!text.contains("not met"), "{f} keeps an old verdict");
        for r in ratios(&text) {
            assert!(
                stands_ratios.contains(&r),
                "{f} says {r}×, which performance.md's \"Where it stands\" does not"
            );
        }
    }
    let flat = perf.split_whitespace().collect::<Vec<_>>().join(" ");
    for line in [
        "**0.89×, 0.84×, 0.95×, 0.85×**",
        "**1.52×, 1.03×, 1.17×, 1.09×**",
    ] {
        assert!(stands.contains(line), "Where it stands lacks {line}");
        assert!(
            flat.matches(line).count() >= 2,
            "no measurement in performance.md says {line}"
        );
    }
}

/// The vLLM page's config is one a node accepts.
#[test]
fn the_vllm_pages_config_is_valid() {
    let page = read(&root().join("docs/src/vllm.md"));
    let toml: Vec<&str> = page
        .split("```toml\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .collect();
    assert!(!toml.is_empty(), "docs/src/vllm.md has no config");
    let node = "[node]\nid = 1\nzone = \"az-a\"\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndata_dir = \"d\"\n\n";
    for block in toml {
        let cfg = zonegate::config::Config::parse("vllm.md", &format!("{node}{block}"))
            .unwrap_or_else(|e| panic!("{e}\n{block}"));
        assert_eq!(
            cfg.model_of_alias("Qwen/Qwen2.5-7B-Instruct"),
            Some("qwen25-7b-instruct")
        );
    }
}

/// Cargo.toml says Apache-2.0; the repository carries its text.
#[test]
fn the_license_file_is_the_apache_2_0_text_cargo_toml_names() {
    let cargo = read(&root().join("Cargo.toml"));
    assert!(cargo.contains("license = \"Apache-2.0\""));
    let license = read(&root().join("LICENSE"));
    assert!(license.trim_start().starts_with("Apache License"));
    assert!(license.contains("Version 2.0, January 2004"));
    assert!(license.contains("END OF TERMS AND CONDITIONS"));
}
