//! The delivery guarantee a sink runs with, chosen per sink in its config.

use serde::{Deserialize, Serialize};

/// What a sink promises about each source record after crashes and restarts.
///
/// | guarantee | how | cost | failure mode |
/// |---|---|---|---|
/// | `ExactlyOnce` | two-phase commit tied to the checkpoint record | output becomes visible about one checkpoint interval later; external transactions stay open that long | none, as long as a transaction is committed before the external system's transaction timeout expires |
/// | `AtLeastOnce` | flush at each checkpoint, no transaction; source positions saved after the flush | lowest latency: records are visible as soon as they are written | after a crash, records written since the last checkpoint are written again: duplicates |
/// | `AtMostOnce` | source positions saved before the records are written | no replay work at all | after a crash, records read but not yet written are lost |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryGuarantee {
    /// Every record becomes visible exactly once, one checkpoint interval after it was read.
    #[default]
    ExactlyOnce,
    /// Every record becomes visible at least once; a crash can repeat the records since the last checkpoint.
    AtLeastOnce,
    /// Every record becomes visible at most once; a crash can lose the records since the last checkpoint.
    AtMostOnce,
}
