//! A held lease: the right to run one background job until it is dropped or lost. A leaf:
//! the backends hand one out, the lease logic wraps them.

use tokio_util::sync::CancellationToken;

/// The right to run one background job, until dropped (released) or lost.
#[derive(Debug)]
pub struct Lease {
    job: String,
    /// Cancelled when the lease is lost (its database session died).
    lost: CancellationToken,
    /// Whatever holds the lock; dropping it releases the lock.
    _hold: Box<dyn std::fmt::Debug + Send + Sync>,
}

impl Lease {
    /// A lease held by `hold` (dropping it releases the lock), lost when `lost` is cancelled.
    pub fn new(
        job: &str,
        lost: CancellationToken,
        hold: Box<dyn std::fmt::Debug + Send + Sync>,
    ) -> Lease {
        Lease {
            job: job.to_owned(),
            lost,
            _hold: hold,
        }
    }

    /// The job this lease is for.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// Completes when the lease is lost (never, for a lease that cannot be lost).
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// Whether the lease was lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }
}
