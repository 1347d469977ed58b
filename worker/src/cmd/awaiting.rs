//! A change-data-capture job may start before its source exists: Debezium's connector creates the change topic
//! (and registers the event schema, with the Avro converter) with its first event. `run` then waits, saying what
//! it waits for, instead of failing; `check-config` says the same and passes.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::config::JobConfig;
use crate::config::KAFKA_REACHABLE_WITHIN;
use kafka_source::{DebeziumConverter, DecodingSettings};

/// How often the source is looked at while waiting.
const POLL: Duration = Duration::from_secs(2);
/// How often the wait is logged.
const LOG_EVERY: Duration = Duration::from_secs(30);

/// What a Debezium job's source still lacks: `None` when it is there (or the job is not a Debezium job).
///
/// # Errors
/// The cluster or the registry cannot be asked (unreachable, credentials refused).
pub async fn missing(job: &JobConfig) -> Result<Option<String>> {
    let DecodingSettings::Debezium { converter, .. } = &job.source.decoding else {
        return Ok(None);
    };
    let Some(topic) = job.source.single_topic() else {
        return Ok(None);
    };
    let topics = [topic.to_string()];
    let metadata = job
        .kafka()?
        .topics_metadata(Some(&topics), KAFKA_REACHABLE_WITHIN)
        .await
        .map_err(anyhow::Error::from)?;
    if metadata.get(topic).is_none_or(|m| m.partitions.is_empty()) {
        return Ok(Some(format!(
            "topic {topic:?} (the Debezium connector creates it with its first change event)"
        )));
    }
    if *converter == DebeziumConverter::Avro
        && let Some(registry) = job.source.schema_registry()?
    {
        let subject = format!("{topic}-value");
        match registry.latest(&subject).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {
                return Ok(Some(format!(
                    "subject {subject} in the schema registry (the connector's Avro converter registers it with \
                     its first change event)"
                )));
            }
            Err(e) => {
                return Err(anyhow::Error::from(e).context(format!(
                    "cannot look up subject {subject} in the schema registry"
                )));
            }
        }
    }
    Ok(None)
}

/// Waits until a Debezium job's source exists ([`missing`]), logging what it waits for.
///
/// # Errors
/// As [`missing`].
pub async fn source(job: &JobConfig) -> Result<()> {
    let mut logged: Option<Instant> = None;
    while let Some(what) = missing(job).await.context("[source]")? {
        if logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            tracing::info!(waiting_for = %what, "the change stream does not exist yet: waiting for it");
            logged = Some(Instant::now());
        }
        tokio::time::sleep(POLL).await;
    }
    if logged.is_some() {
        tracing::info!("the change stream exists: starting");
    }
    Ok(())
}
