//! Compile-time tests of `#[derive(DomainEvent)]` and `#[inbox_handler]` (the `handler_*` files):
//! `ui/pass` must build and run, `ui/fail` must fail with exactly the committed `.stderr`.
//!
//! Regenerate the `.stderr` files with `TRYBUILD=overwrite cargo test --all-features --test it -- ui::`,
//! then read them. Use `--all-features`, as the README's test command does: rustc shortens a path
//! such as `std::marker::Send` only when no crate in the build exports another item of that name,
//! so the messages depend on the features compiled in.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
