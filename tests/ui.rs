//! Compile-time tests of `#[derive(DomainEvent)]` and `#[inbox_handler]` (the `handler_*` files):
//! `ui/pass` must build and run, `ui/fail` must fail with exactly the committed `.stderr`.
//!
//! Regenerate the `.stderr` files with `TRYBUILD=overwrite cargo test --test ui`, then read them.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
