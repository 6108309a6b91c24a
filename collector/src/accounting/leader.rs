//! Background jobs that run once across every collector sharing a database.
//!
//! Energy accounting (and rollups, retention, carbon fetches) must not run once per
//! collector. [`spawn`] runs a job only while this collector holds the job's lease
//! ([`crate::store::JobLeases::try_lead`]); the other collectors ask again every
//! [`LeadOptions::retry`], so when the leader dies (its database session ends, or its lock
//! file closes) another one takes the job over within a few seconds.
//!
//! Using it for a new job is one call:
//!
//! ```ignore
//! leader::spawn(store, "rollups", metrics, LeadOptions::default(), stop, move |term| {
//!     let store = Arc::clone(&store);
//!     async move { rollups::run(store, term).await } // must return soon after `term` is cancelled
//! });
//! ```
//!
//! The job's future receives a token that is cancelled when the collector stops or the
//! lease is lost; it must return soon after. Each term of leadership starts the job
//! afresh, so the job keeps its progress in the database (watermarks), not in memory, and
//! must be idempotent: a lease is not a fence (see [`crate::store::lease`]).
//! Leadership is logged (`leading background job`) and exposed on `/metrics` as
//! `gpufleet_collector_job_leader{job="…"}`.

use crate::metrics::Metrics;
use crate::store::JobLeases;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How a job's lease is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeadOptions {
    /// How often a collector that does not lead asks for the lease again (so how long a
    /// job may go without a leader after the leader died, plus the lease's own detection).
    pub retry: Duration,
}

impl Default for LeadOptions {
    fn default() -> Self {
        LeadOptions {
            retry: Duration::from_secs(2),
        }
    }
}

/// Runs `job` whenever this collector holds its lease, until `stop` is cancelled.
///
/// `work` is called at the start of each term of leadership with a token cancelled when
/// the term ends (`stop`, or the lease lost); the future it returns must finish soon
/// after. The task returns once `stop` is cancelled and any running term has finished.
pub fn spawn<F, Fut>(
    store: Arc<dyn JobLeases>,
    job: &'static str,
    metrics: Arc<Metrics>,
    options: LeadOptions,
    stop: CancellationToken,
    mut work: F,
) -> JoinHandle<()>
where
    F: FnMut(CancellationToken) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    metrics.set_leading(job, false);
    tokio::spawn(async move {
        let mut announced_follower = false;
        while !stop.is_cancelled() {
            match store.try_lead(job).await {
                Ok(Some(lease)) => {
                    info!(job, "leading background job: it runs on this collector");
                    metrics.set_leading(job, true);
                    announced_follower = false;
                    let term = stop.child_token();
                    let run = work(term.clone());
                    tokio::pin!(run);
                    tokio::select! {
                        () = &mut run => {}
                        () = lease.lost() => {
                            warn!(job, "lost the background job's lease; stopping it here");
                            term.cancel();
                            run.await;
                        }
                    }
                    metrics.set_leading(job, false);
                    drop(lease);
                    if !stop.is_cancelled() {
                        info!(job, "no longer leading background job");
                    }
                }
                Ok(None) => {
                    if !announced_follower {
                        info!(job, "background job led by another collector; standing by");
                        announced_follower = true;
                    } else {
                        debug!(job, "background job still led elsewhere");
                    }
                }
                Err(e) => {
                    warn!(job, error = %e, "cannot ask for the background job's lease; retrying");
                }
            }
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(options.retry) => {}
            }
        }
        debug!(job, "background job runner stopped");
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::Instant;

    async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Two collectors (two runners on one store): the job runs on one; when that one
    /// stops, the other takes it over.
    #[tokio::test]
    async fn a_job_runs_once_and_moves_when_its_leader_stops() {
        let store: Arc<dyn crate::store::JobLeases> = Arc::new(
            crate::store::sqlite::SqliteStore::open("sqlite::memory:")
                .await
                .expect("store"),
        );
        let running = Arc::new(AtomicUsize::new(0));
        let max_running = Arc::new(AtomicUsize::new(0));
        let terms = Arc::new(AtomicUsize::new(0));
        let start = |stop: CancellationToken, metrics: Arc<Metrics>| {
            let (running, max_running, terms) = (
                Arc::clone(&running),
                Arc::clone(&max_running),
                Arc::clone(&terms),
            );
            let options = LeadOptions {
                retry: Duration::from_millis(20),
            };
            spawn(
                Arc::clone(&store),
                "test-job",
                metrics,
                options,
                stop,
                move |term| {
                    let (running, max_running, terms) = (
                        Arc::clone(&running),
                        Arc::clone(&max_running),
                        Arc::clone(&terms),
                    );
                    async move {
                        terms.fetch_add(1, SeqCst);
                        let now = running.fetch_add(1, SeqCst) + 1;
                        max_running.fetch_max(now, SeqCst);
                        term.cancelled().await;
                        running.fetch_sub(1, SeqCst);
                    }
                },
            )
        };
        let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
        let (metrics_a, metrics_b) = (Arc::new(Metrics::default()), Arc::new(Metrics::default()));
        let a = start(stop_a.clone(), Arc::clone(&metrics_a));
        wait_for("the first collector to lead", || {
            metrics_a.leading() == [("test-job", true)]
        })
        .await;
        let b = start(stop_b.clone(), Arc::clone(&metrics_b));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(running.load(SeqCst), 1);
        assert_eq!(metrics_b.leading(), [("test-job", false)]);

        stop_a.cancel();
        a.await.expect("runner a");
        assert_eq!(metrics_a.leading(), [("test-job", false)]);
        wait_for("the second collector to take over", || {
            metrics_b.leading() == [("test-job", true)]
        })
        .await;
        wait_for("the job to run again", || running.load(SeqCst) == 1).await;
        assert_eq!(terms.load(SeqCst), 2);
        assert_eq!(max_running.load(SeqCst), 1, "never ran twice at once");
        stop_b.cancel();
        b.await.expect("runner b");
        assert_eq!(running.load(SeqCst), 0);
    }
}
