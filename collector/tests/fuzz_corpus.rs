//! The fuzz targets' entry functions (`fuzz/`, run long with `cargo +nightly fuzz run`)
//! over the committed seed corpus, so that every `cargo test` exercises them without
//! nightly: each input must be handled without a panic.

use std::path::{Path, PathBuf};

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.expect("corpus entry").path();
            let data = std::fs::read(&path).expect("corpus file");
            (path, data)
        })
        .collect();
    files.sort();
    assert!(
        files.len() >= 2,
        "{}: the seed corpus is missing",
        dir.display()
    );
    files
}

fn run(target: &str, entry: fn(&[u8])) {
    for (path, data) in corpus(target) {
        // Each seed, and each of its prefixes: truncated messages are the commonest garbage
        // (and a prefix that ends between fields is a valid message lacking the rest).
        for end in (0..=data.len()).rev() {
            let input = &data[..end];
            if std::panic::catch_unwind(|| entry(input)).is_err() {
                panic!("{target}: {} (first {end} bytes) panicked", path.display());
            }
        }
    }
}

#[test]
fn decode_hello_corpus() {
    run("decode_hello", gpufleet_core::fuzz::hello);
}

#[test]
fn decode_batch_corpus() {
    run("decode_batch", gpufleet_core::fuzz::batch);
}

#[test]
fn api_query_corpus() {
    run("api_query", gpufleet_collector::api::fuzz::api_query);
}

#[test]
fn parse_time_corpus() {
    run("parse_time", gpufleet_core::fuzz::time);
}
