//! Calls the worker makes to its checkpoint store's database outside a subtask (at start-up: recording the job,
//! joining the lease tables): each attempt bounded in time, and retried under [`RetryPolicy::default`] while the
//! database is unreachable, restarting or killed the session, so a replacement worker started during a network
//! blip or a database restart waits it out instead of exiting. Errors the database answers with (a missing
//! privilege, a table of another shape) are not retried.

use std::future::Future;
use std::time::Duration;

use connector_api::RetryPolicy;

/// How long one attempt may take before it counts as a database that does not answer.
pub const ATTEMPT_LIMIT: Duration = Duration::from_secs(10);

/// An attempt that outlived [`ATTEMPT_LIMIT`].
#[derive(Debug)]
pub struct DidNotAnswer {
    what: String,
    limit: Duration,
}

impl DidNotAnswer {
    /// `what` took longer than `limit`.
    pub fn new(what: &str, limit: Duration) -> Self {
        Self {
            what: what.to_string(),
            limit,
        }
    }
}

impl std::fmt::Display for DidNotAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: the checkpoint store's database did not answer within {:?}",
            self.what, self.limit
        )
    }
}

impl std::error::Error for DidNotAnswer {}

/// Runs `attempt` (which must be safe to repeat) bounded by [`ATTEMPT_LIMIT`], retrying while
/// [`is_unavailable`] says the database could not be used; the last error otherwise.
///
/// # Errors
/// The attempt's own error once it is not an outage, or once attempts or time (30 s of waiting) run out.
pub async fn retried<T, F, Fut>(what: &str, mut attempt: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    RetryPolicy::default()
        .run_when(what, is_unavailable, || {
            let call = attempt();
            async move {
                tokio::time::timeout(ATTEMPT_LIMIT, call)
                    .await
                    .unwrap_or_else(|_| Err(DidNotAnswer::new(what, ATTEMPT_LIMIT).into()))
            }
        })
        .await
}

/// Whether `error` says the database could not be used rather than refused the request: it could not be reached
/// or did not answer, the connection broke, or the server ended the session (shutdown, administrator, a
/// serialization failure to repeat).
pub fn is_unavailable(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        if cause.is::<DidNotAnswer>() {
            return true;
        }
        if let Some(e) = cause.downcast_ref::<connector_common::Error>() {
            return e.kind() == connector_common::ErrorKind::Unavailable;
        }
        if let Some(e) = cause.downcast_ref::<tokio_postgres::Error>() {
            return match e.code() {
                // No SQLSTATE: the connection failed or closed under the call.
                None => true,
                Some(code) => {
                    let code = code.code();
                    // 08: connection exception; 57P01-57P03: admin shutdown, crash shutdown, cannot connect now;
                    // 40001 / 40P01: serialization failure, deadlock.
                    code.starts_with("08")
                        || matches!(code, "57P01" | "57P02" | "57P03" | "40001" | "40P01")
                }
            };
        }
        false
    })
}

/// A session on the checkpoint store's database at `url` (the `[store] url`), for the job-level records: the
/// job, its layout generation and history, its partition layout, a rescale. Opening is bounded by the URL's
/// `connect_timeout` (10 s by default); callers bound their statements.
///
/// # Errors
/// The URL does not parse, or the database cannot be reached.
pub async fn store_session(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    use anyhow::Context;
    Ok(connector_common::postgres::PgConnectOptions::parse(url)
        .context("[store] url")?
        .connect("the checkpoint store")
        .await?)
}

/// One connection to the checkpoint store's database for a process's periodic calls (leases, presence), each
/// call bounded: a database that does not answer (a lost route, a hung server) must not hold the process, which
/// also handles signals and restarts, for longer than `limit`. After any failure, a time-out included, the
/// connection is dropped and the next call opens a new one: a hung connection is never reused.
pub struct BoundedSession {
    options: connector_common::postgres::PgConnectOptions,
    client: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
    limit: Duration,
    what: String,
}

impl BoundedSession {
    /// A session to `url` whose calls each take at most `limit`, shown as `application_name` in
    /// `pg_stat_activity`.
    ///
    /// # Errors
    /// The URL is malformed.
    pub fn new(url: &str, application_name: &str, limit: Duration) -> anyhow::Result<Self> {
        use anyhow::Context;
        Ok(Self {
            options: connector_common::postgres::PgConnectOptions::parse(url)
                .context("[store] url")?
                .with_session_limits(limit, application_name),
            client: tokio::sync::Mutex::new(None),
            limit,
            what: application_name.to_string(),
        })
    }

    /// The connection, opened (again) when there is none or it closed; held while the guard lives.
    ///
    /// # Errors
    /// The database cannot be reached.
    pub async fn client(
        &self,
    ) -> anyhow::Result<tokio::sync::MappedMutexGuard<'_, tokio_postgres::Client>> {
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
            *slot = Some(self.options.connect(&self.what).await?);
        }
        Ok(tokio::sync::MutexGuard::map(slot, |slot| {
            slot.as_mut().expect("connected above")
        }))
    }

    /// `call` bounded to the session's limit; the connection is dropped after any failure.
    ///
    /// # Errors
    /// `call`'s error, or [`DidNotAnswer`] when it outlived the limit.
    pub async fn bounded<T>(
        &self,
        what: &str,
        call: impl Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        let outcome = match tokio::time::timeout(self.limit, call).await {
            Ok(outcome) => outcome,
            Err(_) => Err(DidNotAnswer::new(what, self.limit).into()),
        };
        if outcome.is_err() {
            *self.client.lock().await = None;
        }
        outcome
    }

    /// Runs `ddl` (`CREATE TABLE IF NOT EXISTS ...`) in one transaction under the advisory lock `lock`, so
    /// processes starting at once do not race on the catalog; bounded like every call.
    ///
    /// # Errors
    /// The database cannot be reached or refuses, naming `tables`.
    pub async fn create_tables(&self, lock: i64, ddl: &str, tables: &str) -> anyhow::Result<()> {
        self.bounded(&format!("creating {tables}"), async {
            use anyhow::Context;
            self.client()
                .await?
                .batch_execute(&format!(
                    "BEGIN; SELECT pg_advisory_xact_lock({lock}); {ddl} COMMIT;"
                ))
                .await
                .with_context(|| {
                    format!("cannot create {tables} in the checkpoint store's database")
                })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn an_unreachable_database_is_an_outage_and_a_refusal_is_not() {
        let unreachable = anyhow::Error::new(connector_common::Error::unavailable(
            "cannot open the checkpoint store",
        ))
        .context("cannot record the job");
        assert!(is_unavailable(&unreachable));
        let silent: anyhow::Error = DidNotAnswer::new("recording the job", ATTEMPT_LIMIT).into();
        assert!(is_unavailable(&silent));
        assert!(!is_unavailable(&anyhow::anyhow!(
            "ratchet_jobs holds an unknown identity"
        )));
    }

    #[tokio::test]
    async fn an_outage_is_waited_out() {
        let calls = AtomicU32::new(0);
        let answer = retried("test", || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(connector_common::Error::unavailable("cannot open the store").into())
            } else {
                Ok(7)
            }
        })
        .await
        .unwrap();
        assert_eq!(answer, 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_refusal_is_not_retried() {
        let calls = AtomicU32::new(0);
        let outcome: anyhow::Result<()> = retried("test", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(anyhow::anyhow!("permission denied for table ratchet_jobs"))
        })
        .await;
        assert!(outcome.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
