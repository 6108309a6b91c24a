//! The retry loop: one attempt after another, with exponential backoff between them,
//! until delivered, refused, out of attempts or cancelled.
//!
//! What differs between callers is the [`Policy`]'s: remote-write retries without limit
//! (samples must not be lost while the receiver is down), so `Retry-After` is only a floor
//! over the backoff and a request in flight is finished at a term's end (its positions
//! are then saved); alert webhooks give up after `max_attempts`, honour `Retry-After` as
//! given, and abandon a request in flight when their term ends.

use super::Delivery;
use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Exponential backoff between retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffOptions {
    /// The first wait.
    pub min: Duration,
    /// The longest wait (the wait doubles up to it).
    pub max: Duration,
}

impl Default for BackoffOptions {
    fn default() -> Self {
        BackoffOptions {
            min: Duration::from_millis(100),
            max: Duration::from_secs(30),
        }
    }
}

/// The wait before retry number `attempt` (0: the first retry).
pub fn backoff(options: BackoffOptions, attempt: u32) -> Duration {
    options
        .min
        .saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
        .min(options.max)
}

/// How a receiver's `Retry-After` combines with the backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// The longer of the two: a `0` or a date in the past must not turn into a tight loop
    /// against a struggling receiver (for retries without limit).
    AtLeastBackoff,
    /// As the receiver said; the backoff only when it said nothing.
    AsGiven,
}

/// How [`deliver`] retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub backoff: BackoffOptions,
    /// Attempts at most, the first included; `None`: until sent, refused or cancelled.
    pub max_attempts: Option<u32>,
    pub retry_after: RetryAfter,
    /// Whether cancelling abandons an attempt in flight; if not, the attempt is finished
    /// and the loop stops before the next one.
    pub abandon_in_flight: bool,
}

impl Policy {
    /// The wait before retry number `retry` (0: the first), the receiver having said
    /// `after`.
    pub fn wait(&self, retry: u32, after: Option<Duration>) -> Duration {
        let backoff = backoff(self.backoff, retry);
        match (after, self.retry_after) {
            (None, _) => backoff,
            (Some(after), RetryAfter::AtLeastBackoff) => after.max(backoff),
            (Some(after), RetryAfter::AsGiven) => after,
        }
    }
}

/// A retry about to wait, as reported to [`deliver`]'s caller (to count and log it).
#[derive(Debug, Clone, Copy)]
pub struct Retrying<'a> {
    /// Attempts made so far (1: the first failed).
    pub attempt: u32,
    /// How long until the next.
    pub wait: Duration,
    /// Why the last was not delivered.
    pub why: &'a str,
}

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The receiver has it.
    Sent,
    /// Refused for good ([`Delivery::Refused`]).
    Refused { status: u16, why: String },
    /// Still not delivered after the policy's `max_attempts`; `why`: the last attempt's.
    GaveUp { attempts: u32, why: String },
    /// Cancelled before it was sent or refused.
    Cancelled,
}

/// Runs `attempt` until it is sent or refused, waiting between attempts as `policy` says,
/// calling `on_retry` before each wait; stops when `cancel` is cancelled (during a wait,
/// or during an attempt if the policy abandons attempts in flight).
///
/// `attempt` makes a new future per attempt: capture what it needs by reference (a
/// `move` closure over references), so each future borrows from the caller, not the
/// closure.
pub async fn deliver<A, Fut, R>(
    policy: Policy,
    cancel: &CancellationToken,
    mut attempt: A,
    mut on_retry: R,
) -> Outcome
where
    A: FnMut() -> Fut,
    Fut: Future<Output = Delivery>,
    R: FnMut(Retrying<'_>),
{
    let mut attempts = 0u32;
    loop {
        let delivery = if policy.abandon_in_flight {
            tokio::select! {
                () = cancel.cancelled() => return Outcome::Cancelled,
                d = attempt() => d,
            }
        } else {
            attempt().await
        };
        attempts = attempts.saturating_add(1);
        let (after, why) = match delivery {
            Delivery::Sent => return Outcome::Sent,
            Delivery::Refused { status, why } => return Outcome::Refused { status, why },
            Delivery::Retry { after, why } => (after, why),
        };
        if policy.max_attempts.is_some_and(|max| attempts >= max) {
            return Outcome::GaveUp { attempts, why };
        }
        let wait = policy.wait(attempts - 1, after);
        on_retry(Retrying {
            attempt: attempts,
            wait,
            why: &why,
        });
        tokio::select! {
            () = cancel.cancelled() => return Outcome::Cancelled,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    use tokio::time::Instant;

    fn retry(after: Option<u64>) -> Delivery {
        Delivery::Retry {
            after: after.map(Duration::from_millis),
            why: "test".into(),
        }
    }

    fn policy(max_attempts: Option<u32>, retry_after: RetryAfter) -> Policy {
        Policy {
            backoff: BackoffOptions {
                min: Duration::from_millis(100),
                max: Duration::from_millis(250),
            },
            max_attempts,
            retry_after,
            abandon_in_flight: false,
        }
    }

    /// Runs `policy` against scripted answers (then `Sent`): the outcome, when each
    /// attempt started (ms from the start), and the retries reported.
    async fn scripted(
        policy: Policy,
        answers: impl IntoIterator<Item = Delivery>,
    ) -> (Outcome, Vec<u128>, Vec<(u32, u128)>) {
        let mut answers: VecDeque<Delivery> = answers.into_iter().collect();
        let start = Instant::now();
        let mut started = Vec::new();
        let mut retries = Vec::new();
        let outcome = deliver(
            policy,
            &CancellationToken::new(),
            || {
                started.push((Instant::now() - start).as_millis());
                std::future::ready(answers.pop_front().unwrap_or(Delivery::Sent))
            },
            |r| retries.push((r.attempt, r.wait.as_millis())),
        )
        .await;
        (outcome, started, retries)
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let o = BackoffOptions {
            min: Duration::from_millis(100),
            max: Duration::from_secs(30),
        };
        let waits: Vec<u128> = (0..12).map(|a| backoff(o, a).as_millis()).collect();
        assert_eq!(
            waits,
            [
                100, 200, 400, 800, 1_600, 3_200, 6_400, 12_800, 25_600, 30_000, 30_000, 30_000
            ]
        );
        assert_eq!(backoff(o, u32::MAX), o.max);
    }

    /// Without a limit: backoff 100, 200, 250 (capped), then Retry-After 7 s, then
    /// Retry-After 0, which the backoff's 250 ms floors.
    #[tokio::test(start_paused = true)]
    async fn unlimited_retries_back_off_with_retry_after_as_a_floor() {
        let (outcome, started, retries) = scripted(
            policy(None, RetryAfter::AtLeastBackoff),
            [
                retry(None),
                retry(None),
                retry(None),
                retry(Some(7_000)),
                retry(Some(0)),
            ],
        )
        .await;
        assert_eq!(outcome, Outcome::Sent);
        assert_eq!(started, [0, 100, 300, 550, 7_550, 7_800]);
        assert_eq!(
            retries,
            [(1, 100), (2, 200), (3, 250), (4, 7_000), (5, 250)]
        );
    }

    /// With a limit: Retry-After as given (0 retries at once), given up after the last
    /// attempt without waiting again or reporting a retry.
    #[tokio::test(start_paused = true)]
    async fn limited_attempts_give_up_with_retry_after_as_given() {
        let (outcome, started, retries) = scripted(
            policy(Some(3), RetryAfter::AsGiven),
            [retry(Some(0)), retry(None), retry(Some(5_000))],
        )
        .await;
        assert_eq!(
            outcome,
            Outcome::GaveUp {
                attempts: 3,
                why: "test".into()
            }
        );
        assert_eq!(started, [0, 0, 200]);
        assert_eq!(retries, [(1, 0), (2, 200)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_ends_at_once() {
        let refused = Delivery::Refused {
            status: 400,
            why: "bad".into(),
        };
        let (outcome, started, retries) = scripted(
            policy(None, RetryAfter::AtLeastBackoff),
            [retry(None), refused],
        )
        .await;
        assert_eq!(
            outcome,
            Outcome::Refused {
                status: 400,
                why: "bad".into()
            }
        );
        assert_eq!(started, [0, 100]);
        assert_eq!(retries, [(1, 100)]);
    }

    /// Cancelled 1 s into a 5 s attempt: abandoned at once when the policy says so, else
    /// finished, and no other attempt starts.
    #[tokio::test(start_paused = true)]
    async fn cancelling_abandons_an_attempt_in_flight_only_if_asked() {
        for abandon in [true, false] {
            let cancel = CancellationToken::new();
            let canceller = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                canceller.cancel();
            });
            let started = AtomicU32::new(0);
            let finished = AtomicU32::new(0);
            let (started_ref, finished_ref) = (&started, &finished);
            let start = Instant::now();
            let outcome = deliver(
                Policy {
                    abandon_in_flight: abandon,
                    ..policy(None, RetryAfter::AtLeastBackoff)
                },
                &cancel,
                move || async move {
                    started_ref.fetch_add(1, Relaxed);
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    finished_ref.fetch_add(1, Relaxed);
                    retry(None)
                },
                |_| {},
            )
            .await;
            assert_eq!(outcome, Outcome::Cancelled);
            assert_eq!(started.load(Relaxed), 1);
            let (finished, waited) = (finished.load(Relaxed), start.elapsed().as_secs());
            if abandon {
                assert_eq!((finished, waited), (0, 1));
            } else {
                assert_eq!((finished, waited), (1, 5));
            }
        }
    }
}
