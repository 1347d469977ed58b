//! Starting a driver: check the timeout budget, claim the subtask, load the last record, recover every sink under
//! the claim (checked before each sink and by the sinks before each destructive step), release the claim guard,
//! and durably consume a checkpoint id for this attempt.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use super::commit::note_committed;
use super::fault::{crash_error, first_poll};
use super::{Driver, FaultAction, FaultPoint, State, restore, save_decision};
use crate::fence;
use crate::{
    CheckpointId, CheckpointRecord, CheckpointStore, DynSink, Error, ErrorKind, OwnerEpoch, Phase,
    Report, Result, SourceOffset,
};

/// Builds the sinks a job adds once its restored record is known ([`Driver::start_adding`]): called with the
/// record (`None` for a fresh job) under the claim; the future it returns builds them.
pub type SinksForRecord = Box<
    dyn FnOnce(
            Option<&CheckpointRecord>,
        ) -> Pin<Box<dyn Future<Output = Result<Vec<DynSink>>> + Send>>
        + Send,
>;

/// What the driver restored on start.
#[derive(Debug, Clone, PartialEq)]
pub struct Restored {
    /// The last durable checkpoint, `None` for a fresh job.
    pub checkpoint: Option<CheckpointId>,
    /// Where to resume reading the source (empty for a fresh job: start from the beginning).
    pub positions: Vec<SourceOffset>,
    /// The claim this instance holds: every record it saves is conditional on it.
    pub owner: OwnerEpoch,
}

impl<S: CheckpointStore> Driver<S> {
    /// Checks every added sink's transaction timeout against the longest a pre-committed transaction may wait for
    /// its commit under this configuration (checkpoint interval, retries, restart and recovery time). `start` does
    /// this first; `ratchet check-config` does it without starting.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the sink and every term of the budget.
    pub fn check_budget(&self) -> Result<()> {
        let budget = self.config.budget();
        for sink in &self.sinks {
            budget.check(sink.sink_id(), sink.transaction_timeout())?;
        }
        Ok(())
    }

    /// Checks the timeout budget, claims the subtask in the store, loads the last durable record, recovers every
    /// sink from it (commit its committables, abort everything else), opens the next checkpoint's transactions, and
    /// returns the positions to resume from.
    ///
    /// # Errors
    /// [`Fenced`](ErrorKind::Fenced) when a newer instance claimed the subtask meanwhile: this instance must stop.
    /// [`Retryable`](ErrorKind::Retryable) after the retries when the store is unreachable or another instance is
    /// recovering: start again later. A sink's recovery error as the sink reports it.
    pub async fn start(&mut self) -> Result<Restored> {
        self.start_adding(Box::new(|_| Box::pin(async { Ok(Vec::new()) })))
            .await
    }

    /// [`start`](Self::start), adding the sinks `sinks_for` builds from the restored record (`None` for a fresh
    /// job) once it is loaded under the claim, before any sink recovers: for sinks that exist per something the
    /// record names, such as a routed sink's instance per source topic. A record holding work for a sink that is
    /// neither added before nor built here refuses the start, as for a sink removed from the job.
    ///
    /// # Errors
    /// As [`start`](Self::start); what `sinks_for` reports; [`Config`](ErrorKind::Config) for a built sink whose id
    /// another sink has, or whose transaction timeout the budget does not cover.
    pub async fn start_adding(&mut self, sinks_for: SinksForRecord) -> Result<Restored> {
        if self.state != State::Created {
            return Err(Error::new(
                ErrorKind::Bug,
                Phase::Setup,
                "start called twice",
            ));
        }
        self.check_budget()?;
        let outcome = self.claim_and_recover(sinks_for).await;
        if let Err(e) = &outcome {
            self.fail(e);
        }
        outcome
    }

    pub(super) async fn claim_and_recover(
        &mut self,
        sinks_for: SinksForRecord,
    ) -> Result<Restored> {
        let retry = self.config.retry;
        let claim = retry.run("claim", || self.store.claim()).await?;
        let owner = claim.epoch;
        let loaded = retry.run("load checkpoint", || self.store.load()).await?;
        let record = loaded.record;
        let checkpoint = record.as_ref().map(|r| r.id);
        if let Some(committed) = loaded.committed_through
            && Some(committed) > checkpoint
        {
            // The newest records are damaged, and one of them was committed: resuming from an older one would
            // write that checkpoint's records a second time.
            return Err(Error::new(
                ErrorKind::Fatal,
                Phase::Recover,
                format!(
                    "checkpoint {committed} was committed, but its record is damaged or missing (the newest intact \
                     one is {}): falling back would write its records twice. Restore the record from a backup, or \
                     move the source positions past it by hand",
                    checkpoint.map_or("none".to_string(), |c| c.to_string())
                ),
            ));
        }
        // Each start consumes a checkpoint id durably, above every id present (a damaged newest record included),
        // so no id is ever used twice: a crashed attempt may have begun (and, at-least-once, even committed) the
        // checkpoint after the restored one, and a sink that recognises replays by checkpoint id must never mistake
        // the new attempt's data for it.
        let start_id = loaded
            .highest_id
            .max(checkpoint)
            .map_or(CheckpointId(1), CheckpointId::next);
        self.current = start_id;
        self.inject(FaultPoint::AfterLoad).await?;
        // A checkpoint the store notes as committed is not committed again: the external system may have forgotten
        // the transaction since (a Kafka transactional id expires), and recovery only has to abort leftovers. A
        // sink whose commits may defer visibility to a later commit gets it anyway (`restore_committed`); what each
        // sink gets is decided from its entry in the record (the guarantee it was decided under), not from the job
        // file as it is now.
        let already_committed = checkpoint.is_some() && loaded.committed_through >= checkpoint;
        let budget = self.config.budget();
        for sink in sinks_for(record.as_ref()).await? {
            budget.check(sink.sink_id(), sink.0.transaction_timeout())?;
            self.push_sink(sink)?;
        }
        restore::refuse_removed_sinks(&self.sinks, record.as_ref(), already_committed)?;
        restore::refuse_sinks_ahead(&mut self.sinks, loaded.highest_id.max(checkpoint)).await?;
        let limit = self.config.max_recovery_time;
        match tokio::time::timeout(
            limit,
            self.recover_sinks(&claim.guard, record.as_ref(), already_committed),
        )
        .await
        {
            Ok(recovered) => recovered?,
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Retryable,
                    Phase::Recover,
                    format!(
                        "recovery did not finish within max_recovery_time ({limit:?}); stopped (recovery is \
                         idempotent: the next start runs it again). Raise max_recovery_time if a sink's recovery \
                         legitimately takes longer (a large backlog of prepared transactions or staged files)"
                    ),
                ));
            }
        }
        drop(claim.guard);
        if let Some(checkpoint) = checkpoint.filter(|_| !already_committed)
            && let Err(e) = note_committed(&*self.store, retry, owner, checkpoint).await
        {
            tracing::warn!(%checkpoint, error = %Report(&e),
                "cannot note the recovered checkpoint as committed; the next recovery asks the sinks again");
        }
        let positions = record.map(|r| r.positions).unwrap_or_default();
        let start = CheckpointRecord {
            id: start_id,
            positions: positions.clone(),
            committables: BTreeMap::new(),
        };
        self.owner = Some(owner);
        save_decision(&*self.store, retry, owner, &start).await?;
        self.current = start.id.next();
        self.begin_all().await?;
        self.state = State::Running;
        tracing::info!(owner = owner.0, restored = ?checkpoint, next = %self.current,
            sinks = self.sinks.len(), "driver started: claimed the subtask and recovered every sink");
        Ok(Restored {
            checkpoint,
            positions,
            owner,
        })
    }

    /// Recovers every sink in turn from `record`, under `guard`: the claim is checked before each sink, and the
    /// sinks check it before each destructive step.
    pub(super) async fn recover_sinks(
        &mut self,
        guard: &crate::ClaimGuard,
        record: Option<&CheckpointRecord>,
        already_committed: bool,
    ) -> Result<()> {
        let retry = self.config.retry;
        for i in 0..self.sinks.len() {
            let id = self.sinks[i].sink_id().clone();
            let restored = record
                .as_ref()
                .and_then(|r| r.committables.get(&id).map(|v| (r.id, v.clone())));
            // The claim is the fence: a recovery whose claim lapsed touches nothing (and the sinks check again
            // before each destructive step, through `ensure_claim_held`).
            guard
                .check()
                .await
                .map_err(|e| e.at_phase(Phase::Recover).or_sink(&id))?;
            let interrupt = FaultPoint::DuringRecover { sink: id.clone() };
            if self.fault_action(&interrupt).await == FaultAction::Crash {
                // Run the recovery up to its first suspension, then abandon it: a crash inside recover.
                let _ = first_poll(self.sinks[i].recover(restored, already_committed)).await;
                return Err(crash_error(&interrupt));
            }
            let mut attempts = retry.attempts();
            loop {
                let recovery = self.sinks[i].recover(restored.clone(), already_committed);
                match fence::recovering_under(guard.clone(), recovery).await {
                    Err(e) if attempts.retry("recover", &e).await => {}
                    outcome => break outcome.map_err(|e| e.or_sink(&id))?,
                }
            }
            self.inject(FaultPoint::AfterRecover { sink: id }).await?;
        }
        Ok(())
    }
}
