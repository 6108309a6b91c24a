//! Reports and their plots built at once, bounded: building a report reads a range of
//! the store and a plot holds its whole image in memory, so a burst of them (one address
//! may hold hundreds of connections) must not take the collector's memory or CPU.
//!
//! At most `at_once` are built at a time; up to `queue` more wait, each at most `wait`
//! for its turn; the rest, and those whose wait ran out, get `503 Service Unavailable`
//! with `Retry-After` ([`ApiError::Busy`]) and are counted on `/metrics`
//! (`gpufleet_http_renders_refused_total`). The settings are [`RenderLimits`].

use crate::api::error::ApiError;
use crate::metrics::Metrics;
use crate::net::limits::RenderLimits;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Seconds a refused client is asked to wait.
pub const RETRY_AFTER_S: u32 = 2;

/// The render slots the report handlers share.
#[derive(Debug)]
pub struct Renders {
    limits: RenderLimits,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    metrics: Arc<Metrics>,
}

/// One render's slot; dropping it lets the next one in.
#[derive(Debug)]
pub struct RenderSlot(#[allow(dead_code, reason = "held for its drop")] OwnedSemaphorePermit);

/// Counts a waiting request while it waits (also when its request is dropped).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// The default limits, counted into metrics of their own (tests).
impl Default for Renders {
    fn default() -> Self {
        Renders::new(RenderLimits::default(), Arc::default())
    }
}

impl Renders {
    pub fn new(limits: RenderLimits, metrics: Arc<Metrics>) -> Renders {
        Renders {
            slots: Arc::new(Semaphore::new(limits.at_once.max(1))),
            limits,
            waiting: AtomicUsize::new(0),
            metrics,
        }
    }

    /// A slot now, or after waiting in the bounded queue; else [`ApiError::Busy`].
    pub async fn slot(&self) -> Result<RenderSlot, ApiError> {
        if let Ok(p) = Arc::clone(&self.slots).try_acquire_owned() {
            return Ok(RenderSlot(p));
        }
        if self.waiting.fetch_add(1, Relaxed) >= self.limits.queue {
            self.waiting.fetch_sub(1, Relaxed);
            return Err(self.busy(format!(
                "{} reports are being built and {} more are waiting; retry in a few seconds",
                self.limits.at_once, self.limits.queue
            )));
        }
        let _waiting = Waiting(&self.waiting);
        match tokio::time::timeout(self.limits.wait, Arc::clone(&self.slots).acquire_owned()).await
        {
            Ok(Ok(p)) => Ok(RenderSlot(p)),
            _ => Err(self.busy(format!(
                "no report could be built within {} (others are being built); retry in a few \
                 seconds",
                humantime::format_duration(self.limits.wait)
            ))),
        }
    }

    fn busy(&self, message: String) -> ApiError {
        self.metrics.renders_refused.fetch_add(1, Relaxed);
        ApiError::Busy {
            message,
            retry_after_s: RETRY_AFTER_S,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn renders(at_once: usize, queue: usize, wait_ms: u64) -> Arc<Renders> {
        Arc::new(Renders::new(
            RenderLimits {
                at_once,
                queue,
                wait: Duration::from_millis(wait_ms),
            },
            Arc::default(),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn over_the_queue_is_refused_at_once_and_a_long_wait_runs_out() {
        let r = renders(1, 1, 1000);
        let first = r.slot().await.expect("a free slot");
        // The second waits in the queue; the third finds the queue full.
        let waiter = tokio::spawn({
            let r = Arc::clone(&r);
            async move { r.slot().await.map(drop) }
        });
        tokio::task::yield_now().await;
        let third = r.slot().await.expect_err("queue full");
        assert!(matches!(
            third,
            ApiError::Busy {
                retry_after_s: 2,
                ..
            }
        ));
        // The waiter's wait (1 s) runs out while the first slot is held.
        let waited = waiter.await.expect("task").expect_err("wait ran out");
        assert!(waited.to_string().contains("within 1s"), "{waited}");
        assert_eq!(r.metrics.renders_refused.load(Relaxed), 2);
        assert_eq!(r.waiting.load(Relaxed), 0, "the waiter left the queue");
        drop(first);
        r.slot().await.expect("free again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gets_the_slot_that_is_given_back() {
        let r = renders(1, 4, 10_000);
        let first = r.slot().await.expect("a free slot");
        let waiter = tokio::spawn({
            let r = Arc::clone(&r);
            async move { r.slot().await.map(drop) }
        });
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(5)).await;
        drop(first);
        waiter.await.expect("task").expect("got the slot");
        assert_eq!(r.metrics.renders_refused.load(Relaxed), 0);
    }
}
