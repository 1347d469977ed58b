//! The contract every Ratchet sink implements, and the pieces that make it exactly-once.
//!
//! Exactly-once *effect* comes from three parts working together (see `docs/architecture.md`):
//!
//! 1. a replayable source whose positions (Kafka offsets) are saved in each checkpoint;
//! 2. a sink that writes into an external transaction and commits it in two phases ([`TwoPhaseCommit`]);
//! 3. a durable [`CheckpointStore`]: writing checkpoint N's record *is* the commit decision. Before the record is
//!    durable every transaction of N is aborted on recovery (presumed abort); after it, every transaction of N is
//!    committed on recovery, by whichever process restores the record.
//!
//! [`Driver`] runs that protocol over one or more sinks.
#![deny(missing_docs)]

mod blocking;
mod bounded;
mod changes;
pub mod checkpoint;
mod delivery;
mod driver;
pub mod error;
mod fence;
mod ids;
mod inspect;
pub mod metrics;
mod recovery;
mod registry;
mod retry;
mod schema_change;
mod txn;
pub mod types;

pub use blocking::blocking;
pub use bounded::bounded;
pub use changes::{
    AppliedChanges, CHANGE_COLUMN, ChangeColumns, ChangeStep, OP_COLUMN, UNAVAILABLE_COLUMN,
    last_rows_by_key,
};
pub use checkpoint::{
    CheckpointRecord, CheckpointStore, Claim, ClaimGuard, HeldClaim, Loaded, LocalCheckpointStore,
    OwnerEpoch, SourceOffset,
};
pub use delivery::{DeliveryGuarantee, GuaranteedCommitter, GuaranteedSink};
pub use driver::{
    Driver, DriverConfig, FaultAction, FaultInjector, FaultPoint, Faults, Restored, SinkHandle,
    SinksForRecord, Step, StreamEvent, TimeoutBudget, committables_in,
};
pub use error::{Action, Error, ErrorKind, Phase, Report, Result, action, action_after_retries};
pub use fence::ensure_claim_held;
pub use ids::{CheckpointId, JobId, SinkId, SinkScope, SubtaskId};
pub use inspect::{Inspection, OpenTransaction, Resolution, SinkInspection};
pub use recovery::{Fence, FenceOrder, PlanSummary, RecoveryPlan};
pub use registry::{
    DEFAULT_SETUP_TIMEOUT, DynSink, Evolution, SinkBuilder, SinkCheck, SinkContext, SinkFactory,
    SinkRegistry, SinkSpec, parse_settings,
};
pub use retry::{Attempts, RetryPolicy};
pub use schema_change::{FollowedSchema, SchemaChange, Widened, widens};
pub use txn::{Committer, TwoPhaseCommit};
