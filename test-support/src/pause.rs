//! Pausing a driver at a protocol step, to interleave it with another instance or with a fault a test injects
//! (a server blackholed, a session terminated) at exactly that moment.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use connector_api::{CheckpointId, FaultAction, FaultPoint, Faults, Step};
use tokio::sync::Notify;

/// A [`Faults`] that pauses the driver the first time it reaches `step` (of any checkpoint, any sink), tells the
/// test ([`reached`](Self::reached)), and goes on once the test says so ([`resume`](Self::resume)). Never crashes.
pub struct PauseAt {
    step: Step,
    reached: Notify,
    resume: Notify,
    fired: AtomicBool,
}

impl PauseAt {
    /// Pauses at the first `step`; hand a clone of the `Arc` to [`Driver::with_fault_injector`](connector_api::Driver::with_fault_injector).
    pub fn new(step: Step) -> Arc<Self> {
        Arc::new(Self {
            step,
            reached: Notify::new(),
            resume: Notify::new(),
            fired: AtomicBool::new(false),
        })
    }

    /// Waits until the driver is paused at the step.
    pub async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Lets the paused driver go on.
    pub fn resume(&self) {
        self.resume.notify_one();
    }
}

#[async_trait]
impl Faults for PauseAt {
    async fn at(&self, _: CheckpointId, point: &FaultPoint) -> FaultAction {
        if point.step() == self.step && !self.fired.swap(true, Ordering::SeqCst) {
            self.reached.notify_one();
            self.resume.notified().await;
        }
        FaultAction::Continue
    }
}
