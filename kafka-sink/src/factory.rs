//! The Kafka sink in a job file: `[[sinks]]` entries with `type = "kafka"`.

use async_trait::async_trait;
use connector_api::{DeliveryGuarantee, DynSink, Result, SinkContext, SinkFactory, parse_settings};

use crate::{KafkaSink, KafkaSinkConfig};

/// Builds [`KafkaSink`]s from their settings (the keys of [`KafkaSinkConfig`]).
///
/// At-least-once and at-most-once still run through a Kafka transaction per checkpoint (committed at pre-commit,
/// or after the record, by [`GuaranteedSink`](connector_api::GuaranteedSink)); a plain idempotent producer for
/// them is planned, not built.
#[derive(Debug, Clone, Copy, Default)]
pub struct KafkaSinkFactory;

#[async_trait]
impl SinkFactory for KafkaSinkFactory {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    async fn build(
        &self,
        settings: serde_json::Value,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<DynSink> {
        let config: KafkaSinkConfig = parse_settings(&context.sink, self.kind(), settings)?;
        let sink = KafkaSink::new(config, context.sink, context.subtask)?;
        Ok(DynSink::new(sink, delivery))
    }
}
