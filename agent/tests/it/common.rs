//! Fixtures shared by the agent's integration tests.

use std::path::{Path, PathBuf};

/// `shared/cgroups`: the miniature `/proc` with one GPU process per way real clusters run
/// them, and `expected.json`; it sits beside the repository checkout (`<repo>/../shared`).
pub fn cgroup_fixtures() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/cgroups");
    assert!(
        dir.join("expected.json").is_file() && dir.join("proc").is_dir(),
        "cgroup fixtures not found at {}: check out the shared/ folder beside the repository \
         (these tests never skip)",
        dir.display()
    );
    dir
}
