//! The claim is the fence: a recovery whose claim lapsed must not touch anything.
//!
//! Recovery is destructive: it aborts Kafka transactions (`init_transactions`), rolls back prepared database
//! transactions, deletes staged files and Iceberg data files. It is safe only while no newer claim of the subtask
//! can exist, which the store's [`ClaimGuard`](crate::ClaimGuard) guarantees while it holds. A guard kept in a
//! database session can lapse while its process lives (the server ends the session: a restart, a failover,
//! `idle_in_transaction_session_timeout`, `pg_terminate_backend`, a reset connection), and then a second process
//! may claim the subtask and decide a newer checkpoint, whose transactions the first one's recovery would destroy.
//!
//! So the driver runs every sink's [`recover`](crate::TwoPhaseCommit::recover) under its claim, and a sink calls
//! [`ensure_claim_held`] immediately before each destructive step: the check asks the guard's own session (still
//! holding the owner row's lock, epoch still this claim's) within the store's call limit, and fails with
//! [`Fenced`](crate::ErrorKind::Fenced) otherwise, so the recovery stops having touched nothing more. The driver
//! also checks before each sink's recovery, so a sink with one destructive step needs no call of its own.
//!
//! Outside a recovery run by a driver (a sink's unit test calling `recover` directly, `ratchet resolve` holding
//! leases of its own) there is no claim to check and [`ensure_claim_held`] passes.

use std::future::Future;

use crate::{ClaimGuard, Error, ErrorKind, Phase, Result};

tokio::task_local! {
    static RECOVERING_UNDER: ClaimGuard;
}

/// Checks, immediately before the destructive recovery step `step` (named in the error), that the claim this
/// recovery runs under still holds. Passes outside a recovery run by the driver.
///
/// # Errors
/// [`Fenced`](crate::ErrorKind::Fenced) when the claim lapsed: stop the recovery without touching anything.
pub async fn ensure_claim_held(step: &str) -> Result<()> {
    let Ok(guard) = RECOVERING_UNDER.try_with(ClaimGuard::clone) else {
        return Ok(());
    };
    guard.check().await.map_err(|e| {
        tracing::warn!(step, error = %crate::Report(&e),
            "the claim lapsed during recovery: stopping before this step, touching nothing");
        Error::new(
            ErrorKind::Fenced,
            Phase::Recover,
            format!(
                "recovery stopped before {step}, touching nothing: its claim of the subtask lapsed"
            ),
        )
        .with_source(e)
    })
}

/// Runs `recovery` with `guard` as the claim [`ensure_claim_held`] checks. The future must not spawn the steps it
/// checks onto other tasks (a task-local does not follow them).
pub(crate) async fn recovering_under<F: Future>(guard: ClaimGuard, recovery: F) -> F::Output {
    RECOVERING_UNDER.scope(guard, recovery).await
}
