//! Compile errors of `#[locked]`, with their spans: one case per bad attribute or function.
//!
//! Regenerate the expected `.stderr` files after changing a message with
//! `TRYBUILD=overwrite cargo test -p lockkit-macros --test compile_fail`.

#[test]
fn bad_attributes_and_functions_are_compile_errors() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
