//! Fuzz target: unpack_packed (see fuzz/Cargo.toml and gpufleet_packed::fuzz).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpufleet_packed::fuzz::unpack(data));
