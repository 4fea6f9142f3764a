//! The committed seed and regression corpus of the `envelope_decode` fuzz target
//! (`fuzz/corpus/envelope_decode`), replayed on the stable toolchain with the same check the fuzz
//! target runs (`fuzz/check.rs`): decoding never panics, and whatever decodes re-encodes to an
//! equal envelope.

use std::path::{Path, PathBuf};

use outbox_runtime::Envelope;

#[path = "../../fuzz/check.rs"]
mod check;

fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/envelope_decode");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| {
            // What is committed; libFuzzer's own additions (hash names) stay local.
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("seed-") || name.starts_with("regression-")
        })
        .collect();
    files.sort();
    files
}

fn name(path: &Path) -> String {
    path.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn every_corpus_input_decodes_without_panic_and_round_trips() {
    let files = corpus();
    assert!(files.len() >= 40, "the corpus lost its seeds: {files:?}");
    let mut failures = Vec::new();
    for path in &files {
        let data = std::fs::read(path).expect("a corpus file");
        if let Err(panic) = std::panic::catch_unwind(|| check::check(&data)) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            failures.push(format!("{}: {message}", name(path)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The seeds say what they are: `seed-valid-*` decode, the broken ones are refused with an
/// error (not a panic), so the round trip and the error paths are both exercised.
#[test]
fn seeds_decode_or_fail_as_named() {
    let mut valid = 0;
    for path in corpus() {
        let name = name(&path);
        let data = std::fs::read(&path).expect("a corpus file");
        let decoded = Envelope::from_json(&data);
        if name.starts_with("seed-valid-") {
            assert!(decoded.is_ok(), "{name} does not decode: {decoded:?}");
            valid += 1;
        } else if [
            "seed-truncated-",
            "seed-wrong-",
            "seed-not-object-",
            "seed-missing-",
            "seed-empty",
            "seed-whitespace",
            "seed-nul-",
            "seed-lone-surrogate",
            "seed-invalid-utf8",
            "seed-huge-",
            "seed-trailing-garbage",
            "regression-time-before-",
            "regression-time-after-",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        {
            assert!(decoded.is_err(), "{name} decodes: {decoded:?}");
        }
    }
    assert!(valid >= 15, "only {valid} valid seeds");
}
