//! gpufleet-core's integration tests, one binary: a module per area.

mod fuzz_wire;
