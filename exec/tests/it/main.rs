//! gpufleet-exec's integration tests, one binary: a module per area.

mod exec;
