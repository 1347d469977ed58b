//! What the coordinator's description of a transactional id says about one pre-committed transaction: the pure
//! decision behind committing a dead producer's transaction and probing whether it committed.

use crate::committable::KafkaCommittable;
use crate::{TransactionDescription, TransactionState};

/// The next step to commit (or judge) a pre-committed transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitStep {
    /// The coordinator shows this very transaction committed.
    AlreadyCommitted,
    /// The transaction is still open under its producer id and epoch: EndTxn commits it.
    EndTxn,
    /// The transaction ended the other way under its own producer id and epoch (the broker aborted it): lost.
    Lost,
    /// The id has moved on (re-initialised, or expired and forgotten): only the log can tell.
    AskTheLog,
}

/// Decides from `now` (`None`: the broker does not know the id) what to do about `c`.
///
/// Under transaction protocol v1 a commit leaves the epoch unchanged; under v2 (KIP-890) the coordinator bumps it
/// by one at the end of every transaction, so `CompleteCommit` at epoch + 1 is our commit too. `Empty` at epoch + 1
/// is not evidence either way (re-initialising the id after a commit *or* an abort looks like that): the log
/// decides.
pub(crate) fn commit_step(
    now: Option<&TransactionDescription>,
    c: &KafkaCommittable,
) -> CommitStep {
    let Some(now) = now else {
        return CommitStep::AskTheLog;
    };
    if now.producer_id != c.producer_id {
        return CommitStep::AskTheLog;
    }
    let same = now.producer_epoch == c.producer_epoch;
    let next = now.producer_epoch == c.producer_epoch.wrapping_add(1);
    match now.state {
        TransactionState::CompleteCommit if same || next => CommitStep::AlreadyCommitted,
        TransactionState::Ongoing | TransactionState::PrepareCommit if same => CommitStep::EndTxn,
        TransactionState::PrepareAbort
        | TransactionState::CompleteAbort
        | TransactionState::Empty
            if same =>
        {
            CommitStep::Lost
        }
        _ => CommitStep::AskTheLog,
    }
}

#[cfg(test)]
mod tests {
    use connector_api::CheckpointId;

    use super::*;
    use crate::PartitionRange;

    fn committable() -> KafkaCommittable {
        KafkaCommittable {
            checkpoint: CheckpointId(7),
            transactional_id: "p-0-1".into(),
            producer_id: 42,
            producer_epoch: 5,
            ranges: vec![PartitionRange {
                topic: "t".into(),
                partition: 0,
                first_offset: 10,
                last_offset: 20,
            }],
        }
    }

    fn described(
        state: TransactionState,
        producer_id: i64,
        producer_epoch: i16,
    ) -> TransactionDescription {
        TransactionDescription {
            state,
            producer_id,
            producer_epoch,
            timeout_ms: 60_000,
            start_time_ms: -1,
            partitions: Vec::new(),
        }
    }

    #[test]
    fn decides_from_the_transaction_description() {
        let c = committable();
        use TransactionState::*;
        let step = |state: TransactionState, id: i64, epoch: i16| {
            commit_step(Some(&described(state, id, epoch)), &c)
        };
        assert_eq!(step(CompleteCommit, 42, 5), CommitStep::AlreadyCommitted);
        assert_eq!(step(CompleteCommit, 42, 6), CommitStep::AlreadyCommitted); // protocol v2
        // Re-initialised after our transaction ended, either way: not evidence.
        assert_eq!(step(Empty, 42, 6), CommitStep::AskTheLog);
        assert_eq!(step(Ongoing, 42, 5), CommitStep::EndTxn);
        assert_eq!(step(PrepareCommit, 42, 5), CommitStep::EndTxn);
        assert_eq!(step(CompleteAbort, 42, 5), CommitStep::Lost);
        assert_eq!(step(PrepareAbort, 42, 5), CommitStep::Lost);
        // Re-initialised since (a newer epoch or another producer id): the log decides.
        assert_eq!(step(Empty, 42, 9), CommitStep::AskTheLog);
        assert_eq!(step(CompleteCommit, 77, 0), CommitStep::AskTheLog);
        assert_eq!(step(Ongoing, 42, 6), CommitStep::AskTheLog);
        // Expired: the broker forgot the id.
        assert_eq!(commit_step(None, &c), CommitStep::AskTheLog);
    }
}
