//! Fuzz target: decode_hello (see fuzz/Cargo.toml).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpufleet_core::fuzz::hello(data));
