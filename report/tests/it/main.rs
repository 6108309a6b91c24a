//! gpufleet-report's integration tests, one binary: a module per area.

mod report;
