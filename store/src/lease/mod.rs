//! Job leases: which collector runs a background job (energy accounting, rollups,
//! retention, carbon fetches) when several share one database.
//!
//! A [`Lease`] is held until it is dropped or lost; while one collector holds the lease of
//! a job, [`crate::JobLeases::try_lead`] answers `None` to every other asker of the
//! same job on the same database. The backends:
//!
//! - **PostgreSQL** ([`postgres`]): a session advisory lock
//!   (`pg_try_advisory_lock(hashtextextended('gpufleet:' || current_schema() || ':' ||
//!   job, 0))`) on a connection taken out of the pool and kept for the lease's life. The
//!   lock lives and dies with that session: when the collector dies (even `kill -9`) the
//!   server ends the session and the next collector to ask gets the lease. The holder pings
//!   its connection every [`PG_CHECK_EVERY`]; a failed or slow ping marks the lease lost
//!   ([`Lease::lost`]) so the job stops here. The schema is part of the key, so
//!   deployments (and tests) in different schemas of one database do not share leases.
//! - **SQLite** ([`file`](fn@file)): an exclusive `flock` on `<database file>.lead-<job>` kept open
//!   for the lease's life; the kernel releases it when the process dies. It covers
//!   collectors on one host (not network file systems). An in-memory database uses an
//!   in-process lock ([`LocalLeases`]).
//!
//! A lease is not a fence: a collector whose session was ended by the server learns it at
//! its next ping, so for up to [`PG_CHECK_EVERY`] two collectors may both run a job. Jobs
//! run under a lease must therefore be idempotent (recomputing a minute replaces it).

use super::backend::Backend;
use super::{SqlStore, StoreError};
use async_trait::async_trait;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::warn;

pub(crate) mod held;

pub use held::Lease;

/// How often a PostgreSQL lease checks that its session is alive (and how long a check
/// may take before the lease counts as lost).
pub const PG_CHECK_EVERY: Duration = Duration::from_secs(2);

/// Leases held in this process (an in-memory database: nobody else can open it).
#[derive(Debug, Clone, Default)]
pub struct LocalLeases {
    held: Arc<Mutex<HashSet<String>>>,
}

#[derive(Debug)]
struct LocalHold {
    job: String,
    held: Arc<Mutex<HashSet<String>>>,
}

impl Drop for LocalHold {
    fn drop(&mut self) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.job);
    }
}

impl LocalLeases {
    /// The job's lease, unless this process already holds it.
    pub fn try_lead(&self, job: &str) -> Option<Lease> {
        let fresh = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(job.to_owned());
        fresh.then(|| {
            let hold = LocalHold {
                job: job.to_owned(),
                held: Arc::clone(&self.held),
            };
            Lease::new(job, CancellationToken::new(), Box::new(hold))
        })
    }
}

/// The lock file of `job` beside the database file `db`: `<db>.lead-<job>`, with any
/// character outside `[A-Za-z0-9_-]` of the job replaced by `_`.
pub fn lock_file(db: &Path, job: &str) -> PathBuf {
    let job: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut name = db.as_os_str().to_owned();
    name.push(format!(".lead-{job}"));
    PathBuf::from(name)
}

/// The job's lease through an exclusive `flock` on its lock file beside `db`, unless
/// another process (or another open of the file) holds it.
pub fn file(db: &Path, job: &str) -> Result<Option<Lease>, StoreError> {
    let path = lock_file(db, job);
    let io = |source: std::io::Error| StoreError::Lease {
        job: job.to_owned(),
        why: format!("cannot use the lock file {}: {source}", path.display()),
    };
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io)?;
    match f.try_lock() {
        Ok(()) => Ok(Some(Lease::new(job, CancellationToken::new(), Box::new(f)))),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(io(e)),
    }
}

/// What keeps a PostgreSQL lease: dropping it tells the keeper task to close the session.
#[derive(Debug)]
struct PgHold {
    _release: DropGuard,
}

/// The job's lease through a PostgreSQL session advisory lock (see the module docs),
/// unless another session holds it.
pub async fn postgres(pool: &sqlx::PgPool, job: &str) -> Result<Option<Lease>, StoreError> {
    use sqlx::Connection;
    let q = |op| move |source| StoreError::Query { op, source };
    let mut pooled = pool
        .acquire()
        .await
        .map_err(q("take a connection for a job lease"))?;
    let got = sqlx::query_scalar::<_, bool>(
        "SELECT pg_try_advisory_lock(hashtextextended('gpufleet:' || current_schema() || ':' || $1, 0))",
    )
    .bind(job)
    .fetch_one(&mut *pooled)
    .await;
    let got = match got {
        Ok(got) => got,
        Err(e) => {
            // Whether the lock was taken is unknown: end the session rather than pool it.
            let _ = pooled.close().await;
            return Err(q("try a job's advisory lock")(e));
        }
    };
    if !got {
        // It holds no lock: back to the pool (asking every few seconds costs no new session).
        return Ok(None);
    }
    // Out of the pool: the lock belongs to this session, which must never serve anyone
    // else, and closing it is how the lock is released.
    let mut conn = pooled.detach();
    let lost = CancellationToken::new();
    let release = CancellationToken::new();
    let job_name = job.to_owned();
    tokio::spawn({
        let (lost, release) = (lost.clone(), release.clone());
        async move {
            let mut tick = tokio::time::interval(PG_CHECK_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    () = release.cancelled() => {
                        // Ending the session releases its advisory locks.
                        let _ = conn.close().await;
                        return;
                    }
                    _ = tick.tick() => {
                        let ping = sqlx::query("SELECT 1").execute(&mut conn);
                        match tokio::time::timeout(PG_CHECK_EVERY, ping).await {
                            Ok(Ok(_)) => {}
                            Ok(Err(e)) => {
                                warn!(job = %job_name, error = %e, "the job lease's database session failed; the lease is lost");
                                break;
                            }
                            Err(_) => {
                                warn!(job = %job_name, "the job lease's database session did not answer in time; the lease is lost");
                                break;
                            }
                        }
                    }
                }
            }
            lost.cancel();
            // Dropping the connection ends the session, if the server has not already.
            drop(conn);
        }
    });
    Ok(Some(Lease::new(
        job,
        lost,
        Box::new(PgHold {
            _release: release.drop_guard(),
        }),
    )))
}

/// Who runs the background jobs when several collectors share a database.
#[async_trait]
pub trait JobLeases: Send + Sync + std::fmt::Debug {
    /// Whether several collectors may share this database (PostgreSQL: `true`), so each
    /// follows what the others commit (`live::follow` (collector), `--follow-store auto`). SQLite:
    /// `false`, one collector per file.
    fn shared(&self) -> bool;

    /// The lease of a background job: `Some` when this caller may run `job` now, `None`
    /// while someone else (another collector on the same database) holds it. Run jobs
    /// through `accounting::leader::spawn` (collector) rather than calling this directly.
    async fn try_lead(&self, job: &str) -> Result<Option<Lease>, StoreError>;
}

#[async_trait]
impl<DB: Backend> JobLeases for SqlStore<DB> {
    fn shared(&self) -> bool {
        DB::SHARED
    }

    async fn try_lead(&self, job: &str) -> Result<Option<Lease>, StoreError> {
        DB::try_lead(self, job).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_leases_are_exclusive_until_dropped() {
        let leases = LocalLeases::default();
        let a = leases.try_lead("energy").expect("first asker leads");
        assert_eq!(a.job(), "energy");
        assert!(leases.try_lead("energy").is_none(), "held");
        let b = leases.try_lead("rollups").expect("another job is free");
        drop(a);
        assert!(leases.try_lead("energy").is_some(), "released on drop");
        drop(b);
    }

    #[test]
    fn file_leases_are_exclusive_across_opens_and_released_on_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("g.db");
        let a = file(&db, "energy")
            .expect("lock")
            .expect("first asker leads");
        assert!(
            file(&db, "energy").expect("lock").is_none(),
            "a second open of the lock file is refused"
        );
        assert!(file(&db, "carbon").expect("lock").is_some(), "other job");
        drop(a);
        assert!(file(&db, "energy").expect("lock").is_some(), "released");
        assert_eq!(
            lock_file(&db, "../x y"),
            dir.path().join("g.db.lead-___x_y")
        );
    }
}
