//! Where a subtask's batches go: every sink (a routed instance only its topic's batches), tombstones to the sinks
//! that can express a deletion, and the source's rejected records and the rows a sink refuses to the dead-letter
//! topic (found by halving a refused batch), or a stop naming the record when the job has none.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;

use arrow_array::RecordBatch;
use connector_api::{Driver, Error, ErrorKind, Phase, Result, SinkHandle, SinkId};
use kafka_source::{RejectedRecord, Tombstone};

use crate::config::{JobConfig, config_error};
use crate::job::shaping::Shaped;
use crate::jobstore::subtask_store::SubtaskStore;

/// One sink a subtask writes to.
pub struct Output {
    /// The sink in the driver.
    pub handle: SinkHandle,
    /// Its id (a routed entry's instance id).
    pub id: SinkId,
    /// The `[[sinks]]` entry it is an instance of (its `select`).
    pub entry: SinkId,
    /// The topic whose batches it takes (a routed sink's instance); `None`: every batch.
    route: Option<String>,
}

impl Output {
    fn takes(&self, topic: &str) -> bool {
        self.route.as_deref().is_none_or(|route| route == topic)
    }
}

/// Where a subtask's batches go.
pub struct Outputs {
    /// The job's sinks (routed entries as their instances).
    pub sinks: Vec<Output>,
    /// The topics the routed sinks have instances for (`None`: no sink is routed).
    pub routed_topics: Option<BTreeSet<String>>,
    /// The dead-letter sink, when the job has one.
    pub dead_letter: Option<SinkHandle>,
    /// The subtask, as a metrics label.
    pub label: String,
}

impl Outputs {
    /// Where the batches go once the driver started: every sink entry of `job`, routed ones as their instances
    /// for the `topics` built before the start and for those of the `restored` positions (built during it), and
    /// the `dead_letter` sink.
    ///
    /// # Errors
    /// A sink instance the driver lacks (a bug: [`build`](crate::job::assemble::build) adds them all).
    pub fn of_started(
        driver: &Driver<SubtaskStore>,
        job: &JobConfig,
        index: u32,
        mut topics: BTreeSet<String>,
        restored: &connector_api::Restored,
        dead_letter: Option<SinkHandle>,
    ) -> Result<Self> {
        let routed = job.sinks.iter().any(crate::config::routed::is_routed);
        if routed {
            topics.extend(crate::job::assemble::topics_of(&restored.positions));
        }
        let mut sinks = Vec::new();
        for instance in crate::job::routing::instances(&job.sinks, &topics).map_err(config_error)? {
            let handle = driver.handle_of(&instance.spec.id).ok_or_else(|| {
                Error::bug(
                    Phase::Setup,
                    format!("sink {} was not added to the driver", instance.spec.id),
                )
            })?;
            sinks.push(Output {
                handle,
                id: instance.spec.id,
                entry: instance.entry,
                route: instance.route,
            });
        }
        Ok(Outputs {
            sinks,
            routed_topics: routed.then_some(topics),
            dead_letter,
            label: index.to_string(),
        })
    }
}

impl Outputs {
    /// Writes `shaped` to every sink (each its own rows), then the source's `tombstones` (which came after the batch's rows) to every
    /// sink that can express a deletion (the others skip them, counted), and the source's `rejected` records and
    /// the rows a sink refuses to the dead-letter sink (when there is one; otherwise a refused batch stops the
    /// subtask, the record named).
    pub async fn deliver(
        &self,
        driver: &mut Driver<SubtaskStore>,
        shaped: &Shaped,
        topic: &str,
        rejected: &[RejectedRecord],
        tombstones: &[Tombstone],
    ) -> Result<()> {
        self.deliver_rows(driver, shaped, topic, rejected).await?;
        if tombstones.is_empty() {
            return Ok(());
        }
        let keys: Vec<Option<Vec<u8>>> = tombstones.iter().map(|t| t.key.clone()).collect();
        for Output {
            handle: sink, id, ..
        } in self.sinks.iter().filter(|o| o.takes(topic))
        {
            let (outcome, refused) = match driver.write_tombstones(*sink, &keys).await {
                Ok(true) => ("written", 0),
                Ok(false) => ("skipped", 0),
                Err(e) if e.kind() == ErrorKind::BadRecord && self.dead_letter.is_some() => (
                    "written",
                    self.refuse_tombstones(driver, *sink, id, tombstones)
                        .await?,
                ),
                Err(e) => return Err(e),
            };
            metrics::counter!(crate::ops::telemetry::TOMBSTONES, "subtask" => self.label.clone(),
                "sink" => id.to_string(), "outcome" => outcome)
            .increment((keys.len() - refused) as u64);
        }
        Ok(())
    }

    /// A sink refused some of `tombstones` (a key it cannot read): writes them one by one, and each it refuses
    /// goes to the dead-letter topic, naming the sink and why. Returns how many went there.
    async fn refuse_tombstones(
        &self,
        driver: &mut Driver<SubtaskStore>,
        sink: SinkHandle,
        id: &SinkId,
        tombstones: &[Tombstone],
    ) -> Result<usize> {
        let Some(dead_letter) = self.dead_letter else {
            return Ok(0);
        };
        let mut refused = Vec::new();
        for tombstone in tombstones {
            match driver
                .write_tombstones(sink, std::slice::from_ref(&tombstone.key))
                .await
            {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::BadRecord => {
                    refused.push((tombstone.clone(), connector_api::Report(&e).to_string()));
                }
                Err(e) => return Err(e),
            }
        }
        let letters = crate::job::dead_letter::from_refused_tombstones(&refused, id)?;
        driver
            .write(dead_letter, &letters)
            .await
            .map_err(refused_dead_letter)?;
        self.count_dead_letters(refused.len());
        Ok(refused.len())
    }

    async fn deliver_rows(
        &self,
        driver: &mut Driver<SubtaskStore>,
        shaped: &Shaped,
        topic: &str,
        rejected: &[RejectedRecord],
    ) -> Result<()> {
        if let Some(dead_letter) = self.dead_letter
            && !rejected.is_empty()
        {
            let letters = crate::job::dead_letter::from_rejected(rejected)?;
            driver
                .write(dead_letter, &letters)
                .await
                .map_err(refused_dead_letter)?;
            self.count_dead_letters(rejected.len());
        }
        self.set_aside(driver, shaped, topic).await?;
        let input = shaped.input.num_rows() as u64;
        if input == 0 {
            return Ok(());
        }
        for Output {
            handle: sink,
            id,
            entry,
            ..
        } in self.sinks.iter().filter(|o| o.takes(topic))
        {
            let batch = shaped.rows_for(entry);
            let rows = batch.num_rows() as u64;
            if rows == 0 {
                continue;
            }
            match self.dead_letter {
                None => driver.write(*sink, batch).await?,
                Some(dead_letter) => {
                    let mut refused = Vec::new();
                    write_or_refuse(driver, *sink, batch.clone(), &mut refused).await?;
                    if !refused.is_empty() {
                        let letters =
                            crate::job::dead_letter::from_refused_rows(&refused, id, topic)?;
                        driver
                            .write(dead_letter, &letters)
                            .await
                            .map_err(refused_dead_letter)?;
                        self.count_dead_letters(refused.len());
                    }
                }
            }
            metrics::counter!(crate::ops::telemetry::RECORDS_OUT, "subtask" => self.label.clone(), "sink" => id.to_string())
                .increment(rows);
        }
        metrics::counter!(crate::ops::telemetry::RECORDS_IN, "subtask" => self.label.clone())
            .increment(input);
        metrics::counter!(crate::ops::telemetry::BYTES_IN, "subtask" => self.label.clone())
            .increment(shaped.input.get_array_memory_size() as u64);
        Ok(())
    }

    /// The rows a transform failed on go to the dead-letter sink; without one, the first stops the subtask,
    /// naming the transform, the expression and the record.
    async fn set_aside(
        &self,
        driver: &mut Driver<SubtaskStore>,
        shaped: &Shaped,
        topic: &str,
    ) -> Result<()> {
        if shaped.failures.is_empty() {
            return Ok(());
        }
        let Some(dead_letter) = self.dead_letter else {
            let first = &shaped.failures[0];
            let at = match first.position {
                Some((partition, offset)) => format!("{topic}/{partition}@{offset}"),
                None => format!("a record of {topic}"),
            };
            return Err(Error::new(
                ErrorKind::BadRecord,
                Phase::Write,
                format!(
                    "the record at {at}: {}; set such records aside with a [dead_letter] topic, or make the \
                     expression total (TRY_CAST, CASE)",
                    first.failure
                ),
            ));
        };
        let letters = crate::job::dead_letter::from_failed_transforms(
            &shaped.input,
            &shaped.failures,
            topic,
        )?;
        driver
            .write(dead_letter, &letters)
            .await
            .map_err(refused_dead_letter)?;
        self.count_dead_letters(shaped.failures.len());
        Ok(())
    }

    fn count_dead_letters(&self, letters: usize) {
        tracing::warn!(subtask = %self.label, letters, "records sent to the dead-letter topic");
        metrics::counter!(crate::ops::telemetry::DEAD_LETTERS, "subtask" => self.label.clone())
            .increment(letters as u64);
    }
}

/// A dead letter the dead-letter topic refuses (too large for `message.max.bytes`, ...: the cause says) stops the
/// job: it is not the bad input's fault, and there is nowhere else to put it.
fn refused_dead_letter(e: Error) -> Error {
    if e.kind() != ErrorKind::BadRecord {
        return e;
    }
    Error::new(
        ErrorKind::Fatal,
        Phase::Write,
        "the dead-letter topic refused a dead letter",
    )
    .with_source(e)
}

/// Writes `batch` to `sink`; when the sink refuses it ([`BadRecord`](ErrorKind::BadRecord): refused whole, the
/// transaction unchanged), splits it in halves until the refused rows are single, writes the rest, and collects
/// the refused rows with why in `refused`.
fn write_or_refuse<'a>(
    driver: &'a mut Driver<SubtaskStore>,
    sink: SinkHandle,
    batch: RecordBatch,
    refused: &'a mut Vec<(RecordBatch, String)>,
) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>> {
    Box::pin(async move {
        match driver.write(sink, &batch).await {
            Err(e) if e.kind() == ErrorKind::BadRecord => {
                let rows = batch.num_rows();
                if rows == 1 {
                    refused.push((batch, connector_api::Report(&e).to_string()));
                    return Ok(());
                }
                let half = rows / 2;
                write_or_refuse(driver, sink, batch.slice(0, half), refused).await?;
                write_or_refuse(driver, sink, batch.slice(half, rows - half), refused).await
            }
            outcome => outcome,
        }
    })
}
