//! The shape of the tree, checked against the tracked files (`git ls-files`) so that it cannot
//! drift:
//!
//! * README's Layout: every top-level folder has its entry, and every entry's folder exists; in
//!   `tests/`, `benches/`, `examples/`, `docs/` and `scripts/`, every file and folder is named
//!   (by file name, by stem, or by a `prefix_*` pattern), and in `host/` every folder; every
//!   path the Layout names (a word with a `/` or a file extension) exists under its entry.
//! * The libraries' functions (`host/`, `kernels/src/`) fit in 60 lines: longer ones become
//!   named steps.
//!
//! Reported as ignored where `git` or the repository is not there (a packaged crate).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};

/// Folders whose every child the Layout names.
const LISTED_IN_FULL: [&str; 5] = ["tests", "benches", "examples", "docs", "scripts"];
/// Extensions that make a word of the Layout a file name.
const EXTENSIONS: [&str; 6] = [".rs", ".md", ".sh", ".c", ".toml", ".ptx"];

fn main() {
    let args = Arguments::from_args();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = tracked(root).map(Arc::new);
    if files.is_none() {
        eprintln!("layout: SKIPPED: no `git ls-files` here");
    }
    // A check of the tracked files, ignored where there are none to check.
    let on_files = |name: &str, check: fn(&Path, &[String]) -> Result<(), Failed>| {
        let ignored = files.is_none();
        let files = files.clone();
        Trial::test(name, move || check(root, files.as_deref().map_or(&[], Vec::as_slice))).with_ignored_flag(ignored)
    };
    let trials = vec![
        on_files("readme_layout_names_every_tracked_folder", check_layout),
        on_files("library_functions_fit_in_60_lines", check_lengths),
        Trial::test("the_length_check_finds_long_functions", length_check_finds_long_functions),
    ];
    libtest_mimic::run(&args, trials).exit();
}

/// The tracked files, relative to `root`, or `None` without git or a repository.
fn tracked(root: &Path) -> Option<Vec<String>> {
    let out = Command::new("git").arg("-C").arg(root).args(["ls-files", "-z"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let list = String::from_utf8(out.stdout).ok()?;
    Some(list.split('\0').filter(|f| !f.is_empty()).map(str::to_string).collect())
}

fn check_layout(root: &Path, files: &[String]) -> Result<(), Failed> {
    let readme = std::fs::read_to_string(root.join("README.md")).map_err(|e| format!("README.md: {e}"))?;
    let layout = entries(&readme)?;
    let mut problems = Vec::new();
    let top: Vec<&str> =
        unique(files.iter().filter_map(|f| f.split_once('/').map(|(dir, _)| dir)).filter(|d| !d.starts_with('.')));
    for dir in &top {
        if !layout.contains_key(*dir) {
            problems.push(format!("the folder {dir}/ has no entry"));
        }
    }
    for (dir, text) in &layout {
        if !top.contains(&dir.as_str()) {
            problems.push(format!("the entry {dir}/ names no tracked folder"));
            continue;
        }
        let under: Vec<&str> = files.iter().filter_map(|f| f.strip_prefix(&format!("{dir}/"))).collect();
        let words = words(text);
        let children: Vec<&str> = if LISTED_IN_FULL.contains(&dir.as_str()) {
            unique(under.iter().map(|p| p.split('/').next().unwrap_or(p)))
        } else {
            // Every folder below (`backends/mpi`, `device/gpu`), named by its last part; a
            // crate's `src/` goes without saying.
            unique(under.iter().filter_map(|p| p.rsplit_once('/').map(|(folder, _)| folder)))
                .into_iter()
                .filter(|f| *f != "src")
                .collect()
        };
        for child in children {
            if !names(&words, child.rsplit('/').next().unwrap_or(child)) {
                problems.push(format!("{dir}/{child} is not named in the {dir}/ entry"));
            }
        }
        for word in words.iter().filter(|w| is_path(w)) {
            if !exists(&under, word) {
                problems.push(format!("the {dir}/ entry names {word}, which is not tracked under {dir}/"));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("README's Layout is out of date with `git ls-files`:\n  {}", problems.join("\n  ")).into())
    }
}

/// The Layout's entries: top-level folder (without its `/`) → the entry's text.
fn entries(readme: &str) -> Result<BTreeMap<String, String>, String> {
    let section = readme.split("\n## Layout\n").nth(1).ok_or("README.md has no `## Layout` section")?;
    let block = section.split("```text\n").nth(1).and_then(|b| b.split("\n```").next());
    let block = block.ok_or("README's Layout has no ```text block")?;
    let mut entries = BTreeMap::<String, String>::new();
    let mut current = None;
    for line in block.lines() {
        if !line.starts_with(' ') {
            let (head, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let dir =
                head.strip_suffix('/').ok_or_else(|| format!("Layout line does not start with a folder: {line}"))?;
            entries.insert(dir.to_string(), rest.to_string());
            current = Some(dir.to_string());
        } else if let Some(dir) = &current {
            let text = entries.entry(dir.clone()).or_default();
            text.push(' ');
            text.push_str(line.trim());
        }
    }
    Ok(entries)
}

/// The words of an entry: runs of the characters a path can have here.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || "_-./*+".contains(c)))
        .map(|w| w.trim_end_matches(['.', ',']).to_string())
        .filter(|w| !w.is_empty())
        .collect()
}

/// Whether a word is meant as a path: it has a `/` or ends in a file extension.
fn is_path(word: &str) -> bool {
    word.contains('/') || EXTENSIONS.iter().any(|e| word.ends_with(e))
}

/// Whether `words` name the file or folder `name`: by name, by stem, as a folder (`name/`), as a
/// part of a path (`gpu/` in `device/gpu/`), or by a `prefix*` pattern.
fn names(words: &[String], name: &str) -> bool {
    let stem = name.split_once('.').map_or(name, |(s, _)| s);
    words.iter().any(|w| {
        w.split('/').any(|part| part == name || part == stem)
            || w.strip_suffix('*').is_some_and(|prefix| !prefix.is_empty() && name.starts_with(prefix))
    })
}

/// Whether the path `word` (parts joined by `/`, maybe with a trailing `/` or a `*` pattern)
/// is the whole or a run of parts of some tracked path in `under`.
fn exists(under: &[&str], word: &str) -> bool {
    let parts: Vec<&str> = word.trim_end_matches('/').split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return true;
    }
    under.iter().any(|path| {
        let have: Vec<&str> = path.split('/').collect();
        have.windows(parts.len()).any(|run| {
            run.iter().zip(&parts).all(|(h, p)| match p.strip_suffix('*') {
                Some(prefix) => h.starts_with(prefix),
                None => h == p,
            })
        })
    })
}

/// The longest a library function may be, in lines from its signature to its closing brace.
const MAX_FUNCTION_LINES: usize = 60;

fn check_lengths(root: &Path, files: &[String]) -> Result<(), Failed> {
    let sources =
        files.iter().filter(|f| (f.starts_with("host/") || f.starts_with("kernels/src/")) && f.ends_with(".rs"));
    let mut long = Vec::new();
    for file in sources {
        let text = std::fs::read_to_string(root.join(file)).map_err(|e| format!("{file}: {e}"))?;
        long.extend(
            long_functions(&text).into_iter().map(|(name, line, n)| format!("{file}:{line}: {name}, {n} lines")),
        );
    }
    if long.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n  {}",
            long.join("\n  ")
        )
        .into())
    }
}

/// The functions of a rustfmt-formatted file longer than [`MAX_FUNCTION_LINES`]: name, first
/// line (1-based) and length. A function runs from its `fn` line to the first line after it
/// that is its closing brace alone, at the `fn` line's indentation.
fn long_functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut long = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = function_name(line) else { continue };
        let indent = line.len() - line.trim_start().len();
        // The signature ends at the first line with a `{` (a body) or ending in `;` (none); a
        // body that closes on that line is short.
        let Some(open) = (i..lines.len()).find(|&j| lines[j].contains('{') || lines[j].ends_with(';')) else {
            continue;
        };
        if lines[open].ends_with(';') || lines[open].matches('{').count() == lines[open].matches('}').count() {
            continue;
        }
        let closing = format!("{}}}", " ".repeat(indent));
        if let Some(end) = (open + 1..lines.len()).find(|&j| lines[j] == closing) {
            let n = end - i + 1;
            if n > MAX_FUNCTION_LINES {
                long.push((name, i + 1, n));
            }
        }
    }
    long
}

/// The length check on made-up sources: a function of 61 lines (one nested in an `impl`, one
/// with a multi-line signature) is found, one of 60 and one-line functions are not.
fn length_check_finds_long_functions() -> Result<(), Failed> {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let text = format!(
        "fn short() {{ 1 }}\nfn fits() {{\n{}}}\nimpl A {{\n    pub(crate) async unsafe fn long(\n        a: u8,\n    ) {{\n{}    }}\n}}\n",
        body(58),
        body(57)
    );
    let found = long_functions(&text);
    if found == [("long".to_string(), 63, 61)] { Ok(()) } else { Err(format!("found {found:?}").into()) }
}

/// The name of the function a line declares, if it does (`pub(crate) async unsafe fn name<...>(`).
fn function_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().peekable();
    let qualifier = |w: &&str| w.starts_with("pub") || ["const", "async", "unsafe", "extern", "\"C\""].contains(w);
    while words.next_if(qualifier).is_some() {}
    if words.next()? != "fn" {
        return None;
    }
    let rest = words.next()?;
    let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty()).then_some(name)
}

/// The distinct items of `it`, in first-seen order.
fn unique<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = Vec::new();
    for x in it {
        if !seen.contains(&x) {
            seen.push(x);
        }
    }
    seen
}
