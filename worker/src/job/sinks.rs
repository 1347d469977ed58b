//! Every sink type a job file can name.

use connector_api::SinkRegistry;

/// The registry of `ratchet run`: `kafka`, `file`, `iceberg`, `jdbc`.
pub fn registry() -> SinkRegistry {
    let mut registry = SinkRegistry::new();
    registry
        .register(kafka_sink::KafkaSinkFactory)
        .register(file_sink::FileSinkFactory)
        .register(iceberg_sink::IcebergSinkFactory)
        .register(jdbc_sink::JdbcSinkFactory);
    registry
}
