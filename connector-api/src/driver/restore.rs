//! Before recovery touches anything: the restored record and the sinks' own records checked against the sinks the
//! job has now. A job file may have changed since the record was written (a sink removed, a delivery guarantee or
//! a setting changed), and a store may not be the one the sinks' state was written with (a new or reset store, two
//! jobs with one identity). Each of these would otherwise drop a decided checkpoint or skip checkpoint ids the
//! external system already shows, without a word; here they stop the start, naming the sink and what to do.

use crate::driver::ErasedSink;
use crate::driver::erased::entry_pending;
use crate::{CheckpointId, CheckpointRecord, DeliveryGuarantee, Error, ErrorKind, Phase, Result};

/// Refuses to start when `record` holds work recovery must still do for a sink the job no longer has: its
/// decided checkpoint would never be committed there. `committed`: the store notes the record committed.
///
/// # Errors
/// [`Config`](ErrorKind::Config) naming the sink and the checkpoint.
pub(crate) fn refuse_removed_sinks(
    sinks: &[Box<dyn ErasedSink>],
    record: Option<&CheckpointRecord>,
    committed: bool,
) -> Result<()> {
    let Some(record) = record else {
        return Ok(());
    };
    for (sink, entry) in &record.committables {
        if sinks.iter().any(|s| s.sink_id() == sink) {
            continue;
        }
        if entry_pending(sink, record.id, entry, committed)? {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Recover,
                format!(
                    "the job's last checkpoint, {}, is decided and holds work not yet committed in sink {sink}, \
                     which the job no longer has: it would never be committed there. Put the sink's entry back \
                     (same id and settings) and run `ratchet resolve` (or the job once), then remove it",
                    record.id
                ),
            )
            .with_sink(sink)
            .with_checkpoint(record.id));
        }
    }
    Ok(())
}

/// Refuses to start when a sink's external system records a checkpoint of this subtask above every checkpoint the
/// store holds (`newest`, the highest id present; one more for an at-least-once sink, which commits a checkpoint
/// before its record is saved).
///
/// # Errors
/// [`Config`](ErrorKind::Config) naming the sink and both checkpoints; what the sink reports when its record cannot
/// be read.
pub(crate) async fn refuse_sinks_ahead(
    sinks: &mut [Box<dyn ErasedSink>],
    newest: Option<CheckpointId>,
) -> Result<()> {
    for sink in sinks {
        let id = sink.sink_id().clone();
        let Some(recorded) = sink
            .recorded_checkpoint()
            .await
            .map_err(|e| e.or_sink(&id))?
        else {
            continue;
        };
        let slack = u64::from(sink.delivery() == DeliveryGuarantee::AtLeastOnce);
        if recorded.0 <= newest.map_or(0, |n| n.0) + slack {
            continue;
        }
        return Err(Error::new(
            ErrorKind::Config,
            Phase::Recover,
            format!(
                "the sink's external system records checkpoint {recorded} of this subtask, but the checkpoint \
                 store's newest is {}: the store is not the one this sink's state was written with (a new or \
                 reset store, or another job using the same identity in the same table or database). Starting \
                 would skip checkpoint ids the sink already shows. Restore the job's checkpoint store, or give the \
                 job (or the sink's `job`/`scope` setting) a name no other job uses",
                newest.map_or("none (a fresh store)".to_string(), |n| n.to_string())
            ),
        )
        .with_sink(&id));
    }
    Ok(())
}
