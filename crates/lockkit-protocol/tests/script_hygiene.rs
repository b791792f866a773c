//! A static check of every Lua script lockkit runs: inputs travel only as KEYS and ARGV.
//!
//! - No script builds and runs code (`loadstring`, `load`, `dofile`, ...): a value that reaches a
//!   script can never become code.
//! - Every `redis.call`/`redis.pcall` names its command with a string literal.
//! - Every key a command touches is `KEYS[...]` or a variable bound only from `KEYS`: never a
//!   string literal, never a name built by concatenation, never an `ARGV` value. (Channels are not
//!   keys: `PUBLISH` takes its channel from ARGV.) So Redis, a cluster proxy and an ACL see every
//!   key a script touches before it runs.
//!
//! The script texts themselves are `&'static str` compiled in with `include_str!` (see
//! `Script::new`), so no script is ever assembled from data at run time.

use std::collections::BTreeSet;

use lockkit_protocol::script::Script;
use lockkit_protocol::{
    election, fair_lock, fenced_lock, latch, lock, rate_limiter, read_write_lock, semaphore,
    spin_lock,
};

/// Every script of the protocol.
fn all_scripts() -> Vec<&'static Script> {
    vec![
        &lock::ACQUIRE,
        &lock::RELEASE,
        &lock::RENEW,
        &lock::CANCEL,
        &lock::HOLD_COUNT,
        &lock::FORCE_UNLOCK,
        &fenced_lock::ACQUIRE,
        &fenced_lock::RELEASE,
        &fair_lock::ACQUIRE,
        &fair_lock::RELEASE,
        &fair_lock::FORCE_UNLOCK,
        &fair_lock::CANCEL,
        &read_write_lock::ACQUIRE,
        &read_write_lock::RELEASE,
        &read_write_lock::RENEW,
        &read_write_lock::STATUS,
        &read_write_lock::FORCE_UNLOCK,
        &read_write_lock::CANCEL,
        &spin_lock::ACQUIRE,
        &spin_lock::RELEASE,
        &spin_lock::RENEW,
        &semaphore::ACQUIRE,
        &semaphore::RELEASE,
        &semaphore::RENEW,
        &semaphore::TRY_SET_PERMITS,
        &semaphore::ADD_PERMITS,
        &semaphore::AVAILABLE,
        &semaphore::UPDATE_LEASE,
        &semaphore::CANCEL,
        &latch::TRY_SET_COUNT,
        &latch::COUNT_DOWN,
        &election::PROCLAIM,
        &election::RESIGN,
        &election::LEADER,
        &election::RENEW,
        &rate_limiter::ACQUIRE,
        &rate_limiter::CANCEL,
        &rate_limiter::SET_LIMIT,
        &rate_limiter::STATUS,
    ]
}

/// Commands whose first argument is not a key.
const KEYLESS: &[&str] = &["TIME", "PUBLISH", "SPUBLISH"];
/// Commands all of whose arguments are keys.
const ALL_KEYS: &[&str] = &["DEL", "EXISTS", "UNLINK"];
/// Lua functions that turn data into code, or reach outside the script.
const FORBIDDEN: &[&str] = &[
    "loadstring",
    "load",
    "dofile",
    "loadfile",
    "require",
    "setfenv",
    "getfenv",
    "rawset",
    "_G",
];

/// The source without comments; string literals are kept.
fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let mut quote: Option<char> = None;
        let mut chars = line.char_indices().peekable();
        let mut end = line.len();
        while let Some((i, c)) = chars.next() {
            match quote {
                Some(_) if c == '\\' => {
                    chars.next();
                }
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == '\'' || c == '"' => quote = Some(c),
                None if c == '-' && line[i..].starts_with("--") => {
                    end = i;
                    break;
                }
                None => {}
            }
        }
        out.push_str(&line[..end]);
        out.push('\n');
    }
    out
}

/// Splits `text` (what follows an opening parenthesis) into its top-level, comma-separated
/// arguments, up to the matching closing parenthesis.
fn call_args(text: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut current = String::new();
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        if let Some(q) = quote {
            current.push(c);
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' => {
                quote = Some(c);
                current.push(c);
            }
            '(' | '[' | '{' => {
                depth += 1;
                current.push(c);
            }
            ')' | ']' | '}' if depth == 0 => break,
            ')' | ']' | '}' => {
                depth -= 1;
                current.push(c);
            }
            ',' if depth == 0 => args.push(std::mem::take(&mut current).trim().to_owned()),
            _ => current.push(c),
        }
    }
    args.push(current.trim().to_owned());
    args
}

fn is_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_keys_index(text: &str) -> bool {
    text.starts_with("KEYS[") && text.ends_with(']') && !text.contains("..")
}

/// Every `local a, b = x, y` / `a, b = x, y` assignment: (names, values).
fn assignments(code: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let mut found = Vec::new();
    for line in code.lines() {
        let line = line.trim();
        let line = line.strip_prefix("local ").unwrap_or(line);
        let Some(eq) = line.find('=') else { continue };
        let (lhs, rhs) = (&line[..eq], &line[eq + 1..]);
        // Comparisons (`==`, `~=`, `<=`, `>=`) are no assignments.
        if rhs.starts_with('=') || lhs.ends_with(['~', '<', '>', '=']) {
            continue;
        }
        let names: Vec<String> = lhs.split(',').map(|n| n.trim().to_owned()).collect();
        if !names.iter().all(|n| is_identifier(n)) {
            continue;
        }
        found.push((names, call_args(&format!("{rhs})"))));
    }
    found
}

/// The variables that hold keys: bound from `KEYS[...]` or iterated over `ipairs(KEYS)`.
fn key_variables(code: &str) -> BTreeSet<String> {
    let mut vars = BTreeSet::new();
    for (names, values) in assignments(code) {
        for (name, value) in names.iter().zip(&values) {
            if is_keys_index(value) {
                vars.insert(name.clone());
            }
        }
    }
    for line in code.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("for ") {
            if let Some((vars_part, iter)) = rest.split_once(" in ") {
                if iter.trim().starts_with("ipairs(KEYS)") {
                    if let Some(value) = vars_part.split(',').nth(1) {
                        vars.insert(value.trim().to_owned());
                    }
                }
            }
        }
    }
    vars
}

/// Every `local function name(params)`: (name, params).
fn functions(code: &str) -> Vec<(String, Vec<String>)> {
    code.lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("local function ")?;
            let (name, params) = rest.split_once('(')?;
            Some((name.trim().to_owned(), call_args(params)))
        })
        .collect()
}

/// The arguments of every `redis.call`/`redis.pcall` of the code.
fn redis_calls(code: &str) -> Vec<Vec<String>> {
    code.match_indices("redis.")
        .filter_map(|(at, _)| {
            let rest = &code[at + "redis.".len()..];
            let open = ["call(", "pcall("]
                .iter()
                .find_map(|f| rest.strip_prefix(f))?;
            Some(call_args(open))
        })
        .collect()
}

/// The command of a call and its arguments that stand for keys: none for keyless commands, all
/// for `DEL`-like ones, else the first. `None` when the command is no string literal.
fn key_arguments(args: &[String]) -> Option<(String, Vec<String>)> {
    let command = args
        .first()
        .and_then(|c| c.strip_prefix('\'')?.strip_suffix('\''))?
        .to_ascii_uppercase();
    let keys = if KEYLESS.contains(&command.as_str()) {
        Vec::new()
    } else if ALL_KEYS.contains(&command.as_str()) {
        args[1..].to_vec()
    } else {
        args[1..args.len().min(2)].to_vec()
    };
    Some((command, keys))
}

/// Every problem of one script, as readable lines.
fn problems(script: &Script) -> Vec<String> {
    let code = strip_comments(script.source());
    let mut found = Vec::new();

    for word in FORBIDDEN {
        let mut rest = code.as_str();
        while let Some(at) = rest.find(word) {
            let before = rest[..at].chars().next_back();
            let after = rest[at + word.len()..].chars().next();
            let boundary =
                |c: Option<char>| !c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            // `x.load` would be a field; only a free-standing name is the Lua function.
            if boundary(before) && before != Some('.') && boundary(after) {
                found.push(format!("uses `{word}`"));
            }
            rest = &rest[at + word.len()..];
        }
    }

    let keys = key_variables(&code);
    for (names, values) in assignments(&code) {
        for (name, value) in names.iter().zip(&values) {
            if keys.contains(name) && !is_keys_index(value) {
                found.push(format!("key variable `{name}` is also assigned `{value}`"));
            }
        }
    }

    // Helper parameters used as keys: every caller must pass a key in their place.
    let calls = redis_calls(&code);
    let used_as_key: BTreeSet<String> = calls
        .iter()
        .filter_map(|args| key_arguments(args))
        .flat_map(|(_, keys)| keys)
        .collect();
    let helpers = functions(&code);
    let key_params: BTreeSet<String> = helpers
        .iter()
        .flat_map(|(_, params)| params.iter())
        .filter(|param| used_as_key.contains(*param))
        .cloned()
        .collect();
    let is_key =
        |text: &str| is_keys_index(text) || keys.contains(text) || key_params.contains(text);
    for (helper, params) in &helpers {
        let call = format!("{helper}(");
        for (at, _) in code.match_indices(&call) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                || code[..at].ends_with("function ")
            {
                continue;
            }
            let args = call_args(&code[at + call.len()..]);
            for (param, arg) in params.iter().zip(&args) {
                if used_as_key.contains(param) && !is_key(arg) {
                    found.push(format!("{helper}() gets `{arg}` as its key `{param}`"));
                }
            }
        }
    }

    for args in &calls {
        let Some((command, key_args)) = key_arguments(args) else {
            found.push(format!("command is not a string literal: {}", args[0]));
            continue;
        };
        if key_args.is_empty() && !KEYLESS.contains(&command.as_str()) {
            found.push(format!("{command} without a key"));
        }
        for key in &key_args {
            if !is_key(key) {
                found.push(format!(
                    "{command} on `{key}`, which does not come from KEYS"
                ));
            }
        }
    }
    if calls.is_empty() {
        found.push("no redis.call found (is the parser still right?)".to_owned());
    }
    found
}

#[test]
fn no_script_builds_code_or_names_a_key_outside_keys() {
    let mut report = Vec::new();
    for script in all_scripts() {
        for problem in problems(script) {
            report.push(format!("{}: {problem}", script.name()));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

#[test]
fn every_script_file_is_checked() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/scripts");
    let sources: Vec<&str> = all_scripts().iter().map(|s| s.source()).collect();
    let mut files = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "lua") {
            files += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                sources.iter().any(|source| source.contains(text.as_str())),
                "{} is in no script of all_scripts(): add it there",
                path.display()
            );
        }
    }
    assert!(
        files >= all_scripts().len() / 2,
        "found {files} script files"
    );
}

/// The checker itself catches what it is meant to catch.
#[test]
fn the_checker_rejects_string_built_code_and_foreign_keys() {
    let bad = [
        ("loadstring", "return loadstring(ARGV[1])()"),
        ("load", "local f = load(ARGV[1]) return f()"),
        (
            "literal key",
            "return redis.call('GET', 'lockkit:lock:{x}')",
        ),
        (
            "built key",
            "return redis.call('GET', 'lockkit:' .. ARGV[1])",
        ),
        (
            "argv key",
            "local key = ARGV[1]\nreturn redis.call('GET', key)",
        ),
        ("dynamic command", "return redis.call(ARGV[1], KEYS[1])"),
        (
            "rebound key",
            "local key = KEYS[1]\nkey = ARGV[1]\nreturn redis.call('DEL', key)",
        ),
        (
            "second DEL key",
            "return redis.call('DEL', KEYS[1], ARGV[1])",
        ),
        (
            "helper given a foreign key",
            "local function get(k) return redis.call('GET', k) end\nreturn get(ARGV[1])",
        ),
    ];
    for (what, source) in bad {
        let script = Script::new("bad", source);
        assert!(!problems(&script).is_empty(), "{what} was not caught");
    }
    let good = Script::new(
        "good",
        "local key, marker = KEYS[1], ARGV[1] -- redis.call('GET', 'x') in a comment\n\
         for i, k in ipairs(KEYS) do redis.call('PEXPIRE', k, 10) end\n\
         redis.call('PUBLISH', ARGV[2], 'one')\n\
         local function get(k) return redis.call('GET', k) end\n\
         get(KEYS[1])\n\
         return redis.call('HGET', key, marker)",
    );
    assert_eq!(problems(&good), Vec::<String>::new());
}
