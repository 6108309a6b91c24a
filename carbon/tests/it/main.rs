//! gpufleet-carbon's integration tests, one binary: a module per area.

mod http_stub;
