//! `[job] kafka_to_kafka = true`: what a job must look like to run on the fast path (`crate::cmd::fast_path`), and the
//! Kafka sink's settings it runs with.

use anyhow::{Result, bail};
use connector_api::{DeliveryGuarantee, JobId, SinkBuilder, parse_settings};
use kafka_sink::{KafkaSinkConfig, KafkaSinkFactory};

use super::JobConfig;

impl JobConfig {
    /// Checks that the job can run on the fast path (`kafka_to_kafka = true`).
    ///
    /// # Errors
    /// What keeps it from it, and what to change.
    pub fn check_kafka_to_kafka(&self) -> Result<()> {
        let refuse = |why: &str| -> Result<()> {
            bail!(
                "[job] kafka_to_kafka = true needs {why}; remove kafka_to_kafka to run the job through checkpoints"
            )
        };
        let [sink] = self.sinks.as_slice() else {
            return refuse("exactly one [[sinks]] entry");
        };
        if sink.kind != KafkaSinkFactory::KIND || sink.delivery != DeliveryGuarantee::ExactlyOnce {
            return refuse("the sink to be an exactly-once Kafka sink");
        }
        if self.source.single_topic().is_none() {
            return refuse("one source topic (not topics or topic_pattern)");
        }
        if crate::config::routed::is_routed(sink) {
            return refuse("a sink topic without ${topic} (records are copied to one topic)");
        }
        if self.shapes_rows() {
            return refuse("no [[transforms]] and no select (records are copied undecoded)");
        }
        if self.job.subtasks != 1 || self.dead_letter.is_some() {
            return refuse("subtasks = 1 and no [dead_letter] (records are copied undecoded)");
        }
        let config = self.kafka_to_kafka_sink()?;
        if config.bootstrap_servers != self.source.bootstrap_servers {
            return refuse("the sink on the source's cluster (the same bootstrap_servers)");
        }
        Ok(())
    }

    /// The Kafka sink's settings of a `kafka_to_kafka` job, with the job-scoped defaults when the job's name can
    /// scope them (the fast path keeps no checkpoint store, so no job of it predates job scoping in a way that
    /// matters: its prefix was required then).
    ///
    /// # Errors
    /// The job has no sinks, or the sink's settings do not parse.
    pub fn kafka_to_kafka_sink(&self) -> Result<KafkaSinkConfig> {
        let Some(sink) = self.sinks.first() else {
            bail!("[job] kafka_to_kafka = true needs a [[sinks]] entry");
        };
        let job_id = JobId::new(&self.job.name).ok();
        let settings = kafka_sink::with_job_defaults(
            serde_json::Value::Object(sink.settings.clone()),
            job_id.as_ref(),
            &sink.id,
        );
        let mut config: KafkaSinkConfig =
            parse_settings(&sink.id, KafkaSinkFactory::KIND, settings)?;
        config.job.get_or_insert_with(|| self.job.name.clone());
        Ok(config)
    }
}
