//! The guide (`book/`) and the README hold together: every chapter in `book/src` is listed in
//! `SUMMARY.md` and every entry there exists; every relative link (`[text](path)`,
//! `[text](path#anchor)`, images, reference definitions) of a chapter or of the README names a
//! file or folder that exists; and a link with an anchor into a chapter (or within one) names one
//! of that chapter's headings, by mdBook's rule for heading ids. External links are not fetched.
//! Every chapter is also included in `src/guide.rs`, which makes its Rust blocks doctests.
//!
//! Run it alone with `cargo test --all-features --test it -- book`.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Component, Path, PathBuf},
};

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn book_src() -> PathBuf {
    repository().join("book/src")
}

/// `path` relative to the repository, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(repository())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Every `.md` file under `dir`, sorted.
fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", shown(&dir)));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", shown(path)))
}

/// The lines of `text` outside fenced code blocks, numbered from 1, with inline code spans
/// blanked out: what is left is where links and headings can be.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut fence: Option<String> = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let first = trimmed.chars().next().filter(|&c| c == '`' || c == '~');
        let marker: String = first
            .map(|f| trimmed.chars().take_while(|&c| c == f).collect())
            .unwrap_or_default();
        let is_fence = marker.len() >= 3;
        match &fence {
            Some(open) => {
                // A closing fence: the opening one's character, at least as many, nothing after.
                if is_fence
                    && marker.starts_with(open.as_str())
                    && trimmed[marker.len()..].trim().is_empty()
                {
                    fence = None;
                }
            }
            None if is_fence => fence = Some(marker),
            None => lines.push((index + 1, blank_code_spans(line))),
        }
    }
    lines
}

/// `line` with the content of each inline code span (`` `x` ``, ``` `` x `` ```) replaced by spaces.
fn blank_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        // The closing run: the next run of exactly as many backticks.
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let len = chars[j..].iter().take_while(|&&c| c == '`').count();
                if len == run {
                    close = Some(j);
                    break;
                }
                j += len;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                out.extend(std::iter::repeat_n(' ', j + run - i));
                i = j + run;
            }
            None => {
                out.extend(&chars[i..i + run]);
                i += run;
            }
        }
    }
    out
}

/// The targets of the links on one line of prose: inline links and images (`[x](target)`,
/// `![x](target "title")`, `[x](<target>)`) and reference definitions (`[x]: target`).
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[')
        && let Some(end) = trimmed.find("]:")
        && trimmed.find(']') == Some(end)
    {
        if let Some(target) = trimmed[end + 2..].split_whitespace().next() {
            targets.push(target.trim_matches(|c| c == '<' || c == '>').to_owned());
        }
        return targets;
    }
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = i;
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let inside = after[..end].trim();
        let target = match inside.strip_prefix('<') {
            Some(angled) => angled.split('>').next().unwrap_or(""),
            None => inside.split_whitespace().next().unwrap_or(""),
        };
        targets.push(target.to_owned());
        rest = &after[end.min(after.len())..];
    }
    targets
}

/// mdBook's id of a heading whose text is `text`: a `{#custom-id}` at its end, or else the text
/// as rendered (markup dropped), lower-cased, spaces to `-`, every character other than letters,
/// digits, `-` and `_` dropped.
fn heading_id(text: &str) -> String {
    let text = text.trim();
    if let Some(start) = text.rfind("{#")
        && text.ends_with('}')
    {
        return text[start + 2..text.len() - 1].to_owned();
    }
    let mut rendered = String::new();
    let mut rest = text;
    // Links and images render as their text.
    while let Some(open) = rest.find('[') {
        rendered.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("](").zip(after.find(')')) {
            Some((close, end)) if close < end => {
                rendered.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            _ => {
                rendered.push('[');
                rest = after;
            }
        }
    }
    rendered.push_str(rest);
    rendered
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The ids of the headings of a chapter (ATX `#` headings and setext underlines), with mdBook's
/// `-1`, `-2`, … for repeated ones.
fn heading_ids(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut previous: Option<String> = None;
    let mut add = |id: String| {
        let count = seen.entry(id.clone()).or_insert(0);
        let unique = if *count == 0 {
            id
        } else {
            format!("{id}-{count}")
        };
        *count += 1;
        ids.insert(unique);
    };
    // Code spans are part of a heading's text: read the raw line, only fences are skipped.
    let raw: Vec<&str> = text.lines().collect();
    for (number, _) in prose_lines(text) {
        let line = raw[number - 1];
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let title = line[hashes..].trim().trim_end_matches('#').trim();
            add(heading_id(&title.replace('`', "")));
            previous = None;
            continue;
        }
        let underline = line.trim();
        let is_underline = !underline.is_empty()
            && (underline.chars().all(|c| c == '=') || underline.chars().all(|c| c == '-'));
        match previous.take() {
            Some(title) if is_underline => add(heading_id(&title.replace('`', ""))),
            _ => {
                let plain = !line.trim().is_empty()
                    && !line.trim_start().starts_with(['|', '-', '*', '>', '#'])
                    && !line.starts_with("    ");
                previous = plain.then(|| line.trim().to_owned());
            }
        }
    }
    ids
}

/// `path` without `.` and `..` components (the files need not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with the relative links of `file`: one line per link, naming the file, the line,
/// the link and the reason.
fn broken_links(file: &Path) -> Vec<String> {
    let text = read(file);
    let dir = file.parent().expect("a file has a folder");
    let book = book_src();
    let mut problems = Vec::new();
    for (number, line) in prose_lines(&text) {
        for target in link_targets(&line) {
            let place = format!("{}:{number}: link `{target}`", shown(file));
            if target.is_empty() {
                problems.push(format!("{place}: the target is empty"));
                continue;
            }
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.to_path_buf()
            } else if path.starts_with('/') {
                problems.push(format!(
                    "{place}: an absolute path; write it relative to {}",
                    shown(dir)
                ));
                continue;
            } else {
                normalize(&dir.join(path))
            };
            if !resolved.exists() {
                problems.push(format!(
                    "{place}: {} does not exist (paths are relative to {})",
                    shown(&resolved),
                    shown(dir)
                ));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let in_book =
                resolved.starts_with(&book) && resolved.extension().is_some_and(|e| e == "md");
            if in_book && !heading_ids(&read(&resolved)).contains(anchor) {
                problems.push(format!(
                    "{place}: {} has no heading with the id `{anchor}` (ids: {})",
                    shown(&resolved),
                    heading_ids(&read(&resolved))
                        .into_iter()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    problems
}

#[test]
fn every_chapter_is_in_the_summary_and_every_entry_exists() {
    let src = book_src();
    let summary_path = src.join("SUMMARY.md");
    let summary = read(&summary_path);
    let mut problems = Vec::new();
    let mut listed = BTreeSet::new();
    for (number, line) in prose_lines(&summary) {
        for target in link_targets(&line) {
            if target.is_empty() {
                continue; // a draft chapter: listed, no file yet
            }
            let path = normalize(&src.join(target.split('#').next().unwrap_or("")));
            if !path.is_file() {
                problems.push(format!(
                    "{}:{number}: entry `{target}`: {} does not exist",
                    shown(&summary_path),
                    shown(&path)
                ));
            }
            listed.insert(path);
        }
    }
    for chapter in markdown_files(&src) {
        if chapter != summary_path && !listed.contains(&chapter) {
            problems.push(format!(
                "{}: the chapter is not listed in {}",
                shown(&chapter),
                shown(&summary_path)
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn relative_links_of_the_book_and_the_readme_resolve() {
    let mut files = markdown_files(&book_src());
    files.push(repository().join("README.md"));
    let problems: Vec<String> = files
        .iter()
        .map(PathBuf::as_path)
        .flat_map(broken_links)
        .collect();
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn heading_ids_follow_mdbooks_rule() {
    // Ids of headings of this book as mdBook 0.5 writes them into its HTML.
    for (heading, id) in [
        (
            "Handled messages in their own table (outbox_0014)",
            "handled-messages-in-their-own-table-outbox_0014",
        ),
        (
            "The claim's floor (outbox_0011)",
            "the-claims-floor-outbox_0011",
        ),
        ("#[inbox_handler]", "inbox_handler"),
        (
            "The fast path: published right after commit",
            "the-fast-path-published-right-after-commit",
        ),
        ("Retries, backoff and DEAD", "retries-backoff-and-dead"),
        (
            "What \"effectively once\" covers",
            "what-effectively-once-covers",
        ),
        ("A heading {#chosen}", "chosen"),
        ("See [the relay](relay.md)", "see-the-relay"),
    ] {
        assert_eq!(heading_id(heading), id, "{heading}");
    }
    let ids = heading_ids(
        "# Title\n\n## Twice\n\n```text\n## not a heading\n```\n\n## Twice\n\nSetext\n------\n",
    );
    let expected = ["setext", "title", "twice", "twice-1"].map(String::from);
    assert_eq!(ids, BTreeSet::from(expected));
    assert_eq!(
        link_targets("see [a](../a.md#x), ![b](<b c.png>) and [c](d.md \"title\")"),
        ["../a.md#x", "b c.png", "d.md"]
    );
    assert_eq!(blank_code_spans("a `[x](y)` b"), "a          b");
}

#[test]
fn every_chapter_is_doctested() {
    // `src/guide.rs` makes each chapter the documentation of a module, so that
    // `cargo test --doc` compiles and runs its Rust blocks.
    let guide = read(&repository().join("src/guide.rs"));
    let src = book_src();
    let missing: Vec<String> = markdown_files(&src)
        .into_iter()
        .filter(|chapter| !chapter.ends_with("SUMMARY.md"))
        .filter_map(|chapter| {
            let relative = chapter.strip_prefix(&src).ok()?.display().to_string();
            let include = format!("include_str!(\"../book/src/{relative}\")");
            (!guide.contains(&include)).then(|| {
                format!(
                    "{}: not included in src/guide.rs ({include})",
                    shown(&chapter)
                )
            })
        })
        .collect();
    assert!(missing.is_empty(), "\n{}\n", missing.join("\n"));
}
