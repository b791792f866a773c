//! The support table (README "Requirements and support", docs/topologies.md "Support") claims
//! nothing that no test runs: the two copies agree, every ✔ cell names a test file or test, and
//! every test it names exists.

use std::path::Path;

const START: &str = "<!-- support-table";
const END: &str = "<!-- /support-table -->";

fn table_in(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{file}: {err}"));
    let start = text
        .find(START)
        .unwrap_or_else(|| panic!("{file} has no support table"));
    let end = text[start..]
        .find(END)
        .unwrap_or_else(|| panic!("{file}: the support table has no end marker"));
    text[start..start + end].to_owned()
}

/// Every `name.rs` or `name.rs::test` in backticks in `cell`.
fn references(cell: &str) -> Vec<(String, Option<String>)> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|quoted| {
            let (file, test) = match quoted.split_once("::") {
                Some((file, test)) => (file, Some(test.to_owned())),
                None => (quoted, None),
            };
            file.strip_suffix(".rs")
                .filter(|stem| !stem.is_empty() && !stem.contains('/'))
                .map(|_| (file.to_owned(), test))
        })
        .collect()
}

#[test]
fn the_readme_and_the_topology_guide_hold_the_same_table() {
    assert_eq!(table_in("README.md"), table_in("docs/topologies.md"));
}

#[test]
fn every_tick_names_a_test_and_every_named_test_exists() {
    let table = table_in("docs/topologies.md");
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut ticks = 0;
    for line in table.lines().filter(|line| line.starts_with('|')) {
        for cell in line.split('|') {
            let named = references(cell);
            if cell.contains('✔') {
                ticks += 1;
                assert!(
                    !named.is_empty() || cell.contains("the whole suite"),
                    "a ✔ that names no test: {cell:?}"
                );
            }
            for (file, test) in named {
                let source = std::fs::read_to_string(tests.join(&file))
                    .unwrap_or_else(|err| panic!("the table names tests/{file}: {err}"));
                if let Some(test) = test {
                    assert!(
                        source.contains(&format!("fn {test}(")),
                        "the table names {file}::{test}, which does not exist"
                    );
                }
            }
        }
    }
    assert!(ticks >= 10, "the table has its ✔ cells ({ticks} found)");
}

#[test]
fn references_are_read_from_backticks() {
    assert_eq!(
        references("✔ `cluster.rs::a_test`, `sentinel.rs` and `SSUBSCRIBE`"),
        vec![
            ("cluster.rs".to_owned(), Some("a_test".to_owned())),
            ("sentinel.rs".to_owned(), None),
        ]
    );
}
