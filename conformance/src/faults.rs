//! The harness's fault injector: crashes armed per checkpoint and step, and pauses that interleave two instances
//! of one job (a process paused with SIGSTOP and resumed later).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use connector_api::{CheckpointId, FaultAction, FaultPoint, Faults};
use tokio::sync::Notify;

use super::scenario::{CrashAt, sinks};

/// The crashes still to inject: (checkpoint, step). Shared with the driver's fault injector.
pub(super) type Armed = Arc<Mutex<Vec<(u64, CrashAt)>>>;

/// Whether `point` is where `at` crashes.
fn fault_matches(point: &FaultPoint, at: CrashAt) -> bool {
    let (step, which) = at.point();
    point.step() == step && which.is_none_or(|i| point.sink() == Some(&sinks()[i]))
}

/// Pauses an instance once at `point`: tells `reached`, then waits for `release` (at most `max_wait`, so a
/// scenario whose other instance is blocked, as it should be, still ends).
pub(super) struct Pause {
    pub(super) point: FaultPoint,
    /// Only at this checkpoint (`None`: the first time the point is reached).
    pub(super) checkpoint: Option<u64>,
    pub(super) reached: Arc<Notify>,
    pub(super) release: Arc<Notify>,
    pub(super) max_wait: Duration,
}

/// Armed crashes and pauses, for one driver.
pub(super) struct HarnessFaults {
    pub(super) armed: Armed,
    pub(super) pauses: Mutex<Vec<Pause>>,
}

#[async_trait]
impl Faults for HarnessFaults {
    async fn at(&self, checkpoint: CheckpointId, point: &FaultPoint) -> FaultAction {
        let pause = {
            let mut pauses = self.pauses.lock().expect("pauses");
            pauses
                .iter()
                .position(|p| p.point == *point && p.checkpoint.is_none_or(|c| c == checkpoint.0))
                .map(|i| pauses.remove(i))
        };
        if let Some(pause) = pause {
            pause.reached.notify_one();
            let _ = tokio::time::timeout(pause.max_wait, pause.release.notified()).await;
        }
        let mut armed = self.armed.lock().expect("armed crashes");
        match armed
            .iter()
            .position(|(cp, at)| *cp == checkpoint.0 && fault_matches(point, *at))
        {
            Some(i) => {
                armed.remove(i);
                FaultAction::Crash
            }
            None => FaultAction::Continue,
        }
    }
}
