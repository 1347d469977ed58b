//! A Debezium PostgreSQL connector on the test services' Kafka Connect (`connect`), capturing one table of the
//! test PostgreSQL: registered through `test-support/cdc/debezium.py`, removed (connector, replication slot,
//! publication) when dropped, however the test ends: a slot left behind would hold the server's WAL.

use crate::Services;

/// How the connector's converter writes the change events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Converter {
    /// Kafka's JsonConverter, `schemas.enable` as given.
    Json {
        /// Whether each value is `{"schema": .., "payload": <event>}`.
        schemas: bool,
    },
    /// Apicurio's AvroConverter in Confluent's wire format, schemas in the test registry (`<topic>-value`).
    Avro,
}

/// A registered connector; dropping it removes it.
#[derive(Debug)]
pub struct DebeziumConnector {
    name: String,
    topic: String,
}

impl DebeziumConnector {
    /// Registers connector `name` capturing `table` (`schema.table`) with `converter`, its replication slot and
    /// publication named `name` too; returns once the snapshot is over and the change topic exists (the table's
    /// rows are in the topic or being committed; a table without rows may have no topic yet). Fails the test
    /// naming what failed.
    pub fn register(name: &str, table: &str, converter: Converter) -> Self {
        Self::register_with(name, table, converter, &[])
    }

    /// [`register`](Self::register) with connector settings added or overridden (`decimal.handling.mode`, ...).
    pub fn register_with(
        name: &str,
        table: &str,
        converter: Converter,
        settings: &[(&str, &str)],
    ) -> Self {
        let services = Services::get();
        let registry;
        let mut args = vec![
            "register",
            services.connect_url(),
            name,
            "--table",
            table,
            "--topic-prefix",
            name,
            "--slot",
            name,
            "--publication",
            name,
            "--bootstrap",
            services.kafka_bootstrap(),
        ];
        match converter {
            Converter::Json { schemas } => {
                args.extend(["--schemas", if schemas { "true" } else { "false" }])
            }
            Converter::Avro => {
                registry = services.registry().url;
                args.extend(["--avro", registry.as_str()]);
            }
        }
        let settings: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for setting in &settings {
            args.extend(["--set", setting.as_str()]);
        }
        services.cdc(&args);
        Self {
            name: name.to_string(),
            topic: Self::topic_of(name, table),
        }
    }

    /// The topic connector `name` capturing `table` writes to, before it is registered: `<name>.<schema>.<table>`.
    pub fn topic_of(name: &str, table: &str) -> String {
        format!("{name}.{table}")
    }

    /// The topic the changes go to: `<name>.<schema>.<table>`.
    pub fn topic(&self) -> &str {
        &self.topic
    }
}

impl Drop for DebeziumConnector {
    fn drop(&mut self) {
        let services = Services::get();
        services.cdc(&[
            "delete",
            services.connect_url(),
            &self.name,
            "--slot",
            &self.name,
            "--publication",
            &self.name,
        ]);
    }
}
