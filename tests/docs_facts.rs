//! The facts the docs repeat, kept in one place: the oldest Redis lockkit supports and the
//! defaults its bounds are documented with. Each fact is stated once here (or read from the
//! library's own constants), and every place in the README, the guides, the crates' READMEs, the
//! rustdoc and the demo script that states it is found by its wording and checked against it.
//! A doc that says "Redis >= 7.0" where the README says 6.2, or "5 s keep-alive" after the
//! constant changed, fails here. (The sample outputs of the command-line tool are checked against
//! the tool's real output in `crates/lockkit-cli/tests/doc_samples.rs`; the support table in
//! `tests/support_table.rs`.)

use std::path::{Path, PathBuf};
use std::time::Duration;

use lockkit::protocol::lock::{GRANT_PROBATION, HANDOFF_WINDOW, WAITER_KEEPALIVE};

/// The oldest Redis that lockkit supports (README, "Requirements and support"): the matrix runs
/// the suite on Redis 6.2.14.
const MIN_REDIS: &str = "6.2";

/// The files a user reads: the READMEs, the guides, the demo script, and the library's source
/// (for its rustdoc).
fn user_docs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md"), root.join("scripts/demo")];
    for dir in ["docs", "crates"] {
        collect(&root.join(dir), &mut files);
    }
    files
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            // Generated or third-party text is not ours to check.
            if !path.ends_with("target") {
                collect(&path, files);
            }
        } else if path
            .extension()
            .is_some_and(|ext| ext == "md" || ext == "rs")
        {
            files.push(path);
        }
    }
}

/// The text of `file` a user reads: a Rust file's doc comments only (`///`, `//!`), the whole of
/// any other file.
fn read(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_else(|err| panic!("{file:?}: {err}"));
    if file.extension().is_some_and(|ext| ext == "rs") {
        text.lines()
            .filter_map(|line| {
                let line = line.trim_start();
                line.strip_prefix("///")
                    .or_else(|| line.strip_prefix("//!"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        text
    }
}

/// Every version number (`7.0`, `6.2.14`) right after each occurrence of `phrase` in `text`,
/// with the line it is on.
fn versions_after<'a>(text: &'a str, phrase: &str) -> Vec<(String, &'a str)> {
    let mut found = Vec::new();
    for line in text.lines() {
        let mut rest = line;
        while let Some(at) = rest.find(phrase) {
            rest = &rest[at + phrase.len()..];
            let version: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let version = version.trim_end_matches('.').to_owned();
            if !version.is_empty() {
                found.push((version, line));
            }
        }
    }
    found
}

/// Every duration written as `<number> s` or `<number> ms` (also `5s`, `10ms`) in `text`.
fn durations(text: &str) -> Vec<Duration> {
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric()) {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                i += 1;
            }
            let number: f64 = text[start..i].trim_end_matches('.').parse().unwrap_or(-1.0);
            let unit = text[i..].trim_start_matches(' ');
            let word_end = |len: usize| {
                unit.as_bytes()
                    .get(len)
                    .is_none_or(|c| !c.is_ascii_alphanumeric())
            };
            if number >= 0.0 {
                if unit.starts_with("ms") && word_end(2) {
                    found.push(Duration::from_secs_f64(number / 1000.0));
                } else if unit.starts_with('s') && word_end(1) {
                    found.push(Duration::from_secs_f64(number));
                }
            }
        } else {
            i += 1;
        }
    }
    found
}

/// For each occurrence of one of `phrases` (a wording that states the fact) in the user docs,
/// the duration that goes with it: `"<phrase>"`, the first duration in the short clause after
/// it; `"{} <phrase>"`, the duration right before it. `(file, text, duration)`.
fn stated(phrases: &[&str]) -> Vec<(String, String, Duration)> {
    let mut found = Vec::new();
    for file in user_docs() {
        let text = read(&file);
        // One paragraph at a time, its lines joined (a phrase may wrap).
        for paragraph in text.split("\n\n") {
            let joined = paragraph.split_whitespace().collect::<Vec<_>>().join(" ");
            for phrase in phrases {
                if let Some(after) = phrase.strip_prefix("{}") {
                    let mut from = 0;
                    while let Some(at) = joined[from..].find(after) {
                        let end = from + at;
                        let start = joined[..end]
                            .char_indices()
                            .rev()
                            .nth(11)
                            .map_or(0, |(i, _)| i);
                        let before = &joined[start..end];
                        if let Some(value) = durations(before).last() {
                            found.push((
                                file.display().to_string(),
                                format!("{before}{after}"),
                                *value,
                            ));
                        }
                        from = end + after.len();
                    }
                    continue;
                }
                let mut rest = joined.as_str();
                while let Some(at) = rest.find(phrase) {
                    rest = &rest[at + phrase.len()..];
                    // The value follows the phrase closely: up to the next clause break.
                    let clause: String = rest
                        .chars()
                        .take(24)
                        .take_while(|c| !matches!(c, ';' | ':' | '|'))
                        .collect();
                    if let Some(value) = durations(&clause).first() {
                        found.push((
                            file.display().to_string(),
                            format!("{phrase}{clause}"),
                            *value,
                        ));
                    }
                }
            }
        }
    }
    found
}

/// Checks that every statement found by `phrases` gives `value`, and that there are at least
/// `at_least` of them (so that a change of wording cannot make the check pass by finding
/// nothing).
fn every_statement_is(what: &str, phrases: &[&str], value: Duration, at_least: usize) {
    let found = stated(phrases);
    let wrong: Vec<String> = found
        .iter()
        .filter(|(_, _, stated)| *stated != value)
        .map(|(file, text, stated)| format!("{file}: \"{text}\" says {stated:?}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "the {what} is {value:?}, but:\n{}",
        wrong.join("\n")
    );
    assert!(
        found.len() >= at_least,
        "the {what} is stated in at least {at_least} places, but {} were found: {found:?}",
        found.len()
    );
}

#[test]
fn the_oldest_supported_redis_is_the_same_everywhere() {
    let mut found = Vec::new();
    for file in user_docs() {
        let text = read(&file);
        for phrase in ["Redis >= ", "Redis ≥ ", "Redis "] {
            for (version, line) in versions_after(&text, phrase) {
                let claims_minimum = line.contains("or newer")
                    || line.contains("or later")
                    || line.contains(">=")
                    || line.contains('≥')
                    || line.contains("needs");
                if claims_minimum
                    && phrase == "Redis "
                    && !line.contains(&format!("Redis {version} or newer"))
                {
                    continue;
                }
                if claims_minimum {
                    found.push((file.display().to_string(), version, line.trim().to_owned()));
                }
            }
        }
    }
    let wrong: Vec<String> = found
        .iter()
        .filter(|(_, version, _)| version != MIN_REDIS)
        .map(|(file, version, line)| format!("{file}: says {version}: {line}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "lockkit supports Redis {MIN_REDIS} or newer, but:\n{}",
        wrong.join("\n")
    );
    assert!(
        found
            .iter()
            .any(|(file, _, _)| file.ends_with("/README.md") && !file.contains("crates")),
        "the README states the oldest supported Redis: {found:?}"
    );
    assert!(
        found
            .iter()
            .any(|(file, _, _)| file.ends_with("scripts/demo")),
        "the demo warns about an older Redis: {found:?}"
    );
}

/// The demo's version test compares the major version with the same minimum it names.
#[test]
fn the_demo_warns_below_the_oldest_supported_redis_and_not_above() {
    let demo = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/demo"));
    let (major, minor) = MIN_REDIS.split_once('.').unwrap();
    let test = format!("is_older_than {major} {minor}");
    assert!(
        demo.contains(&test),
        "scripts/demo tests the server's version with `{test}`"
    );
}

#[test]
fn the_default_watchdog_timeout_and_renewal_are_stated_as_they_are() {
    let timeout = lockkit::DEFAULT_WATCHDOG_TIMEOUT;
    every_statement_is(
        "default watchdog lease",
        &[
            "watchdog mode: ",
            "watchdog timeout, ",
            "watchdog timeout — ",
            "watchdog-mode holds (default ",
            "{} lease) are renewed",
        ],
        timeout,
        5,
    );
    every_statement_is(
        "watchdog's renewal period",
        &["renewed every "],
        timeout / 3,
        3,
    );
}

#[test]
fn the_default_timeouts_are_stated_as_they_are() {
    every_statement_is(
        "default command timeout",
        &[
            "command timeout** (default ",
            "command timeout (",
            "{} by default); an acquire",
        ],
        lockkit::DEFAULT_COMMAND_TIMEOUT,
        2,
    );
    every_statement_is(
        "default connect timeout",
        &["connect timeout ("],
        lockkit::DEFAULT_CONNECT_TIMEOUT,
        1,
    );
}

#[test]
fn the_line_s_keep_alive_probation_and_handoff_window_are_stated_as_they_are() {
    every_statement_is(
        "waiters' keep-alive",
        &["keep-alive (", "{} keep-alive"],
        WAITER_KEEPALIVE,
        2,
    );
    every_statement_is(
        "grant probation",
        &["on probation for ", "probation: it expires after "],
        GRANT_PROBATION,
        2,
    );
    every_statement_is(
        "handoff window",
        &["handoff window (", "{} handoff window"],
        HANDOFF_WINDOW,
        2,
    );
}

#[test]
fn durations_and_versions_are_read_as_written() {
    assert_eq!(
        durations("a 5 s lease, 10ms, 1.5s; not 3 sets or v2s"),
        vec![
            Duration::from_secs(5),
            Duration::from_millis(10),
            Duration::from_millis(1500)
        ]
    );
    assert_eq!(
        versions_after("needs Redis 7.0.15, or Redis 6.2.", "Redis "),
        vec![
            ("7.0.15".to_owned(), "needs Redis 7.0.15, or Redis 6.2."),
            ("6.2".to_owned(), "needs Redis 7.0.15, or Redis 6.2.")
        ]
    );
}
