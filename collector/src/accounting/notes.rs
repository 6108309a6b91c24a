//! What commits touched, noted by a task of its own for a background job.
//!
//! The accountant and the rollup task learn which (series, minute) each commit wrote from
//! its announcement ([`crate::live::state::Live::subscribe`]). Announcements wait for every
//! subscriber in a bounded ring. A job that received them only between its passes fell
//! behind for as long as a pass ran (closing a minute of 8,000 GPUs, packing, retention):
//! with 1,000 nodes it missed thousands at a time (BENCHMARKS.md), and every miss costs a
//! recheck of the recent minutes of every series against the raw rows. [`Notes`] receives
//! them as they come, on a task that does nothing else, and the job takes what was noted
//! before each pass.

use crate::live::state::{Committed, Live};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// What was noted since the job last took it.
#[derive(Debug)]
pub struct Noted<K> {
    /// The keys the announced commits touched.
    pub touched: BTreeSet<K>,
    /// An announcement was missed, or came without its ticks: what it touched is unknown,
    /// and the job must recheck.
    pub missed: bool,
}

impl<K> Default for Noted<K> {
    fn default() -> Self {
        Noted {
            touched: BTreeSet::new(),
            missed: false,
        }
    }
}

/// A listener noting what announced commits touch, until its `stop` is cancelled or it
/// is dropped.
#[derive(Debug)]
pub struct Notes<K> {
    noted: Arc<Mutex<Noted<K>>>,
    task: JoinHandle<()>,
}

impl<K: Ord + Send + 'static> Notes<K> {
    /// Subscribes now (no commit announced after this call is left out) and notes what
    /// `touched` says each commit touched. `job` names the job in the warning a miss logs.
    pub fn start<I>(
        live: Arc<Live>,
        job: &'static str,
        stop: CancellationToken,
        touched: impl Fn(&Live, &Committed) -> I + Send + 'static,
    ) -> Notes<K>
    where
        I: IntoIterator<Item = K>,
    {
        let noted = Arc::new(Mutex::new(Noted::default()));
        let mut rx = live.subscribe();
        let shared = Arc::clone(&noted);
        let task = tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    () = stop.cancelled() => break,
                    msg = rx.recv() => msg,
                };
                match msg {
                    Ok(c) => {
                        let keys = touched(&live, &c);
                        let mut noted = lock(&shared);
                        noted.missed |= c.partial;
                        noted.touched.extend(keys);
                    }
                    Err(RecvError::Lagged(n)) => {
                        warn!(
                            missed = n,
                            job, "commit announcements missed; rechecking recent minutes"
                        );
                        lock(&shared).missed = true;
                    }
                    Err(RecvError::Closed) => break,
                }
            }
        });
        Notes { noted, task }
    }

    /// What was noted since the last call.
    pub fn take(&self) -> Noted<K> {
        std::mem::take(&mut *lock(&self.noted))
    }
}

impl<K> Drop for Notes<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<K>(noted: &Mutex<Noted<K>>) -> MutexGuard<'_, Noted<K>> {
    // Nothing panics while holding the lock, so a poisoned one still holds whole notes.
    noted.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_core::{Batch, Tick};
    use std::time::Duration;

    fn commit(seq: u64) -> Committed {
        Committed {
            node: "n".into(),
            batch: Batch {
                seq,
                ticks: vec![Tick {
                    time_ms: seq as i64,
                    ..Tick::default()
                }],
                ..Batch::default()
            },
        }
    }

    /// A job busy for longer than the announcement ring lasts (it takes nothing while
    /// 5,000 commits are announced, yielding as a pass awaiting its database does) still
    /// gets every commit's keys, and no miss.
    #[tokio::test]
    async fn commits_are_noted_while_the_job_is_busy() {
        let live = Arc::new(Live::new());
        let stop = CancellationToken::new();
        let notes = Notes::start(Arc::clone(&live), "test", stop.clone(), |_, c| {
            c.batch.ticks.iter().map(|t| t.time_ms).collect::<Vec<_>>()
        });
        const N: u64 = 5_000;
        for seq in 0..N {
            live.announce(commit(seq));
            if seq % 100 == 99 {
                tokio::task::yield_now().await;
            }
        }
        let mut all = BTreeSet::new();
        tokio::time::timeout(Duration::from_secs(10), async {
            while all.len() < N as usize {
                let noted = notes.take();
                assert!(!noted.missed, "announcements missed");
                all.extend(noted.touched);
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("every commit noted");
        assert_eq!(all, (0..N as i64).collect::<BTreeSet<_>>());
        // Stopped, it notes no more.
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), async {
            while live.has_subscribers() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the listener ends with its stop");
    }
}
