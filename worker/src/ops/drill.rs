//! Crash and pause drills, so operators and tests can rehearse recovery, `ratchet inspect` and `ratchet resolve` on
//! a real in-doubt state, and the take-over of a process that went silent. Never set them in production.
//!
//! - `RATCHET_KILL_AT=<step>:<checkpoint>` makes the worker kill itself with SIGKILL at that protocol step of that
//!   checkpoint, or of the first later one that reaches the step (in whichever subtask reaches it first). Steps: `after-pre-commit` (transactions prepared, record
//!   not saved: recovery aborts them), `after-record-durable` (decided, not committed: recovery commits them),
//!   `after-commit`, and at a schema change `before-evolve` (the old schema's checkpoints committed, no sink
//!   changed) and `after-evolve` (after the first sink added the columns). The checkpoint of the evolve steps is
//!   the one open when the schema changes.
//! - `RATCHET_PAUSE_AT=<step>` makes the worker stop itself with SIGSTOP the first time any subtask reaches that
//!   step: a process that went silent without closing anything (its connections stay open, its kernel answers TCP
//!   keepalives), like a machine that lost its network. Steps: `after-load` (it holds the subtask's claim guard,
//!   recovery not begun), `after-recover`, `after-pre-commit`, `after-record-durable`, `after-commit`.
//! - `RATCHET_RESCALE_KILL_AT=<step>` makes a rescale (`ratchet rescale`, or `ratchet run` rescaling at start) kill
//!   its process with SIGKILL at that step ([`crate::job::rescale`]): `after-resolve` (every old subtask resolved, the
//!   old layout in effect), `after-new-records` (the new layout's records written, not switched),
//!   `after-switch` (the new layout in effect, the old one's records not retired).
//! - `RATCHET_FORGET_KILL_AT=after-subtask-<n>` makes `ratchet forget-topic` kill its process with SIGKILL once it
//!   saved subtask `n` without the topic's positions, before the later subtasks ([`crate::cmd::forget`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use connector_api::{CheckpointId, FaultInjector, FaultPoint, Step};
use nix::sys::signal::{Signal, raise};

/// The kill drill's variable.
pub const KILL_VARIABLE: &str = "RATCHET_KILL_AT";

/// The pause drill's variable.
pub const PAUSE_VARIABLE: &str = "RATCHET_PAUSE_AT";

/// The steps a drill can kill the rescale at (`RATCHET_RESCALE_KILL_AT`, [`crate::ops::drill`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RescaleStep {
    /// Every old subtask resolved; nothing of the new layout written.
    Resolved,
    /// The new layout's records written; not switched.
    NewRecordsWritten,
    /// Switched; the old generation not retired.
    Switched,
}

impl RescaleStep {
    /// The step's name in the drill variable.
    pub fn name(self) -> &'static str {
        match self {
            Self::Resolved => "after-resolve",
            Self::NewRecordsWritten => "after-new-records",
            Self::Switched => "after-switch",
        }
    }
}

/// The rescale drill's variable.
pub const RESCALE_KILL_VARIABLE: &str = "RATCHET_RESCALE_KILL_AT";

/// Kills this process with SIGKILL when `RATCHET_RESCALE_KILL_AT` names `step`.
#[allow(clippy::disallowed_methods)] // a drill's switch, read where it is checked
pub fn rescale_reached(step: RescaleStep) {
    if std::env::var(RESCALE_KILL_VARIABLE).is_ok_and(|at| at == step.name()) {
        tracing::warn!(
            step = step.name(),
            "rescale drill: this process kills itself with SIGKILL"
        );
        let _ = raise(Signal::SIGKILL);
    }
}

/// The forget drill's variable.
pub const FORGET_KILL_VARIABLE: &str = "RATCHET_FORGET_KILL_AT";

/// Kills this process with SIGKILL when `RATCHET_FORGET_KILL_AT` is `after-subtask-<subtask>`.
#[allow(clippy::disallowed_methods)] // a drill's switch, read where it is checked
pub fn forget_reached(subtask: u32) {
    if std::env::var(FORGET_KILL_VARIABLE).is_ok_and(|at| at == format!("after-subtask-{subtask}"))
    {
        tracing::warn!(
            subtask,
            "forget-topic drill: this process kills itself with SIGKILL"
        );
        let _ = raise(Signal::SIGKILL);
    }
}

/// The injector `RATCHET_KILL_AT` or `RATCHET_PAUSE_AT` asks for, if set.
///
/// # Errors
/// A value that names no step the driver reaches in a running job, or both variables set.
#[allow(clippy::disallowed_methods)] // the drills are configured by the environment
pub fn from_env() -> Result<Option<FaultInjector>> {
    match (
        std::env::var(KILL_VARIABLE).ok(),
        std::env::var(PAUSE_VARIABLE).ok(),
    ) {
        (None, None) => Ok(None),
        (Some(kill), None) => kill_at(&kill).map(Some),
        (None, Some(pause)) => pause_at(&pause).map(Some),
        (Some(_), Some(_)) => bail!("set {KILL_VARIABLE} or {PAUSE_VARIABLE}, not both"),
    }
}

fn kill_at(value: &str) -> Result<FaultInjector> {
    let (step, checkpoint) = value
        .split_once(':')
        .with_context(|| format!("{KILL_VARIABLE}={value:?}: expected <step>:<checkpoint>"))?;
    let step = Step::parse(step)
        .with_context(|| format!("{KILL_VARIABLE}={value:?}: unknown step {step:?}"))?;
    if !matches!(
        step,
        Step::AfterPreCommit
            | Step::AfterRecordDurable
            | Step::AfterCommit
            | Step::BeforeEvolve
            | Step::AfterEvolve
    ) {
        bail!(
            "{KILL_VARIABLE}={value:?}: use after-pre-commit, after-record-durable, after-commit, before-evolve or \
             after-evolve"
        );
    }
    let checkpoint: u64 = checkpoint
        .parse()
        .with_context(|| format!("{KILL_VARIABLE}={value:?}: the checkpoint is not a number"))?;
    tracing::warn!(%step, checkpoint, "crash drill: this process kills itself with SIGKILL at that step");
    Ok(Arc::new(
        move |current: CheckpointId, point: &FaultPoint| {
            if point.step() == step && current.0 >= checkpoint {
                let _ = raise(Signal::SIGKILL);
            }
            false
        },
    ))
}

fn pause_at(value: &str) -> Result<FaultInjector> {
    let step =
        Step::parse(value).with_context(|| format!("{PAUSE_VARIABLE}={value:?}: unknown step"))?;
    if matches!(
        step,
        Step::DuringRecover | Step::AfterWrite | Step::WhileCommitting
    ) {
        bail!(
            "{PAUSE_VARIABLE}={value:?}: use after-load, after-recover, after-pre-commit, after-record-durable or \
             after-commit"
        );
    }
    tracing::warn!(%step, "pause drill: this process stops itself with SIGSTOP the first time it reaches that step");
    let fired = AtomicBool::new(false);
    Ok(Arc::new(move |_: CheckpointId, point: &FaultPoint| {
        if point.step() == step && !fired.swap(true, Ordering::SeqCst) {
            tracing::warn!(%point, "pause drill: stopping this process (SIGSTOP)");
            let _ = raise(Signal::SIGSTOP);
        }
        false
    }))
}
