//! Fuzz target: api_query (see fuzz/Cargo.toml).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpufleet_collector::api::fuzz::api_query(data));
