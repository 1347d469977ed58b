//! Crash drills: `RATCHET_KILL_AT=<step>:<checkpoint>` makes the worker kill itself with SIGKILL at that protocol
//! step of that checkpoint (in whichever subtask reaches it first), so operators and tests can rehearse recovery,
//! `ratchet inspect` and `ratchet resolve` on a real in-doubt state. Steps: `after-pre-commit` (transactions
//! prepared, record not saved: recovery aborts them), `after-record-durable` (decided, not committed: recovery
//! commits them), `after-commit`. Never set it in production.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use connector_api::{CheckpointId, FaultInjector, FaultPoint, Step};

/// The variable.
pub const VARIABLE: &str = "RATCHET_KILL_AT";

/// The injector `RATCHET_KILL_AT` asks for, if set.
///
/// # Errors
/// A value that is not `<step>:<checkpoint>` with a step the driver reaches in a running job.
pub fn from_env() -> Result<Option<FaultInjector>> {
    let Ok(value) = std::env::var(VARIABLE) else {
        return Ok(None);
    };
    let (step, checkpoint) = value
        .split_once(':')
        .with_context(|| format!("{VARIABLE}={value:?}: expected <step>:<checkpoint>"))?;
    let step = Step::parse(step)
        .with_context(|| format!("{VARIABLE}={value:?}: unknown step {step:?}"))?;
    if !matches!(
        step,
        Step::AfterPreCommit | Step::AfterRecordDurable | Step::AfterCommit
    ) {
        bail!("{VARIABLE}={value:?}: use after-pre-commit, after-record-durable or after-commit");
    }
    let checkpoint: u64 = checkpoint
        .parse()
        .with_context(|| format!("{VARIABLE}={value:?}: the checkpoint is not a number"))?;
    tracing::warn!(%step, checkpoint, "crash drill: this process kills itself with SIGKILL at that step");
    let injector: FaultInjector = Arc::new(move |current: CheckpointId, point: &FaultPoint| {
        if point.step() == step && current.0 == checkpoint {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        false
    });
    Ok(Some(injector))
}
