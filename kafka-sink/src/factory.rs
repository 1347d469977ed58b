//! The Kafka sink in a job file: `[[sinks]]` entries with `type = "kafka"`.

use async_trait::async_trait;
use connector_api::{
    DeliveryGuarantee, DynSink, JobId, Result, SinkBuilder, SinkCheck, SinkContext, SinkId,
    SinkScope,
};
use serde_json::Value;

use crate::{KafkaAtLeastOnceSink, KafkaSink, KafkaSinkConfig};

/// Builds [`KafkaSink`]s from their settings (the keys of [`KafkaSinkConfig`]).
///
/// At-least-once builds a [`KafkaAtLeastOnceSink`]: no transactions at all, records acknowledged before the
/// checkpoint record is saved. At-most-once still runs through a Kafka transaction per checkpoint, committed after
/// the record and never by recovery ([`GuaranteedSink`](connector_api::GuaranteedSink)): without a transaction the
/// records would be visible before their positions are durable, and a replay would write them twice.
#[derive(Debug, Clone, Copy, Default)]
pub struct KafkaSinkFactory;

#[async_trait]
impl SinkBuilder for KafkaSinkFactory {
    const KIND: &'static str = "kafka";
    type Settings = KafkaSinkConfig;

    fn complete_settings(settings: Value, context: &SinkContext) -> Value {
        with_job_defaults(settings, context.job.as_ref(), &context.sink)
    }

    async fn build_sink(
        &self,
        config: KafkaSinkConfig,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<DynSink> {
        crate::types::check(
            &config.records,
            &context.schema,
            &context.sink,
            &config.topic,
        )?;
        if delivery == DeliveryGuarantee::AtLeastOnce {
            // The sink is at-least-once by itself: nothing for the adapter to change.
            let sink = KafkaAtLeastOnceSink::new(config, context.sink)?
                .with_evolution(context.schema, context.evolution);
            return Ok(DynSink::new(sink, DeliveryGuarantee::ExactlyOnce));
        }
        let sink = KafkaSink::new(config, context.sink, context.subtask)?
            .with_evolution(context.schema, context.evolution);
        Ok(DynSink::new(sink, delivery))
    }

    async fn check_sink(
        &self,
        config: KafkaSinkConfig,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<SinkCheck> {
        crate::types::check(
            &config.records,
            &context.schema,
            &context.sink,
            &config.topic,
        )?;
        crate::check::check(config, delivery).await
    }
}

/// The Kafka sink's `settings` of a job file, completed for `job` ([`SinkContext::job`]): in a job whose sinks are
/// scoped by the job, `transactional_id_prefix` defaults to the sink's scope (`<job>~<sink id>`) and `job` (the
/// prefix registry's owner) to the job's name; settings that give them keep theirs. Without a job both stay as the
/// settings say (the prefix is then required).
pub fn with_job_defaults(mut settings: Value, job: Option<&JobId>, sink: &SinkId) -> Value {
    if let (Some(job), Value::Object(map)) = (job, &mut settings) {
        map.entry("transactional_id_prefix")
            .or_insert_with(|| Value::String(SinkScope::new(Some(job), sink).to_string()));
        map.entry("job")
            .or_insert_with(|| Value::String(job.to_string()));
    }
    settings
}
