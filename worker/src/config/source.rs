//! `[source]` of a job file: the Kafka topic, how its records become rows, and what to do about a gap in its log.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use kafka_source::{AvroDecoding, AvroFraming, Decoding, GapPolicy, KeyDecoding, MetadataColumns};
use serde::Deserialize;

/// `[source]`: one Kafka topic, read with `isolation.level=read_committed` from the checkpointed positions.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// Kafka bootstrap servers.
    pub bootstrap_servers: String,
    /// The topic.
    pub topic: String,
    /// How records become rows (`text` by default).
    #[serde(default)]
    pub decoding: DecodingConfig,
    /// Add a `headers` column (the same as `metadata.headers = "headers"`).
    #[serde(default)]
    pub headers: bool,
    /// Record metadata as columns after the decoding's (`[source.metadata]`).
    #[serde(default)]
    pub metadata: MetadataConfig,
    /// Rows per batch at most.
    #[serde(default)]
    pub batch_rows: Option<usize>,
    /// librdkafka settings: connection (`security.protocol`, `ssl.*`, `sasl.*`) and consumer tuning.
    #[serde(default)]
    pub client: BTreeMap<String, String>,
    /// A position below its partition's log start (records removed before the job read them): stop (`fail`,
    /// the default) or go on from the log start (`earliest`).
    #[serde(default)]
    pub on_gap: OnGap,
    /// How often the topic's metadata is read again: partitions added while the job runs are read within this
    /// long, a deleted or recreated topic stops the job.
    #[serde(default = "thirty_seconds", with = "humantime_serde")]
    pub metadata_refresh: Duration,
}

/// `[source.metadata]`: which record metadata becomes columns, each under the name given (absent: not added).
/// Types and null rules: docs/worker.md, "Record metadata as columns".
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataConfig {
    /// The record's topic (`Utf8`).
    pub topic: Option<String>,
    /// Its partition (`Int32`).
    pub partition: Option<String>,
    /// Its offset (`Int64`).
    pub offset: Option<String>,
    /// Its timestamp (`Timestamp(Microsecond, UTC)`; null when the record has none).
    pub timestamp: Option<String>,
    /// Its key: the column (text, binary) or the prefix of the key's field columns `<key>_<field>` (JSON, Avro).
    pub key: Option<String>,
    /// How the key is decoded: `text` (the default), `binary`, `json` with fields, or `avro` like the value.
    #[serde(default)]
    pub key_decoding: Option<DecodingConfig>,
    /// Its headers (`Map<Utf8, Binary>`).
    pub headers: Option<String>,
}

impl SourceConfig {
    /// The metadata columns `[source]` asks for (`headers = true` is `metadata.headers = "headers"`).
    ///
    /// # Errors
    /// Both `headers = true` and `metadata.headers`; `key_decoding` without `key`; a key decoding that does not
    /// parse.
    pub fn metadata_columns(&self) -> Result<MetadataColumns> {
        let metadata = &self.metadata;
        let headers = match (self.headers, &metadata.headers) {
            (true, Some(name)) => bail!(
                "[source] sets both `headers = true` and `metadata.headers = {name:?}`: keep one (`headers = true` \
                 is the column `headers`)"
            ),
            (true, None) => Some("headers".to_string()),
            (false, name) => name.clone(),
        };
        let key = match (&metadata.key, &metadata.key_decoding) {
            (None, Some(_)) => {
                bail!(
                    "[source.metadata] key_decoding needs `key`, the name of the key column (or column prefix)"
                )
            }
            (None, None) => None,
            (Some(name), decoding) => {
                let decoding = match decoding {
                    None | Some(DecodingConfig::Text) => KeyDecoding::Text,
                    Some(DecodingConfig::Binary) => KeyDecoding::Binary,
                    Some(declared) => KeyDecoding::Declared(
                        declared
                            .decoding()
                            .context("[source.metadata] key_decoding")?,
                    ),
                };
                Some((name.clone(), decoding))
            }
        };
        Ok(MetadataColumns {
            topic: metadata.topic.clone(),
            partition: metadata.partition.clone(),
            offset: metadata.offset.clone(),
            timestamp: metadata.timestamp.clone(),
            key,
            headers,
        })
    }
}

/// `on_gap`: what a subtask does when records were removed from the log before it read them.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnGap {
    /// Stop the subtask, naming topic, partition, the next offset and the log start.
    #[default]
    Fail,
    /// Go on from the log start; logged, and counted in `ratchet_source_gap_records_total`.
    Earliest,
}

fn thirty_seconds() -> Duration {
    Duration::from_secs(30)
}

/// `decoding = { kind = ... }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum DecodingConfig {
    /// `topic`, `partition`, `offset`, `key`, `value`; key and value as UTF-8 text.
    #[default]
    Text,
    /// The same with key and value as bytes.
    Binary,
    /// Each value a JSON object decoded into the declared fields.
    Json {
        /// The columns, in order.
        fields: Vec<FieldConfig>,
    },
    /// Each value one Avro record of the declared writer schema; the columns follow the schema's fields.
    Avro {
        /// The writer schema (Avro schema JSON).
        schema: String,
        /// How values frame the Avro body.
        framing: AvroFramingConfig,
        /// The schema's id in the registry (`framing = "confluent"`).
        #[serde(default)]
        schema_id: Option<u32>,
    },
}

/// `framing` of the Avro decoding.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AvroFramingConfig {
    /// Confluent Schema Registry's wire format: `0x00`, the 4-byte schema id, the body.
    Confluent,
    /// Avro's single-object encoding: `0xC3 0x01`, the schema's Rabin fingerprint, the body.
    SingleObject,
}

/// One declared column of the JSON decoding.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldConfig {
    /// The JSON key and column name.
    pub name: String,
    /// Its type.
    #[serde(rename = "type")]
    pub column_type: ColumnType,
    /// Whether it may be null or absent (default true).
    #[serde(default = "yes")]
    pub nullable: bool,
}

fn yes() -> bool {
    true
}

/// Column types of the JSON decoding.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnType {
    /// UTF-8 text.
    String,
    /// 32-bit integer.
    Int32,
    /// 64-bit integer.
    Int64,
    /// 64-bit float.
    Float64,
    /// true / false.
    Boolean,
    /// Days since 1970-01-01, or an ISO date.
    Date,
    /// Microseconds since the epoch, or an RFC 3339 timestamp; UTC.
    TimestampMicros,
}

impl ColumnType {
    fn data_type(self) -> DataType {
        match self {
            Self::String => DataType::Utf8,
            Self::Int32 => DataType::Int32,
            Self::Int64 => DataType::Int64,
            Self::Float64 => DataType::Float64,
            Self::Boolean => DataType::Boolean,
            Self::Date => DataType::Date32,
            Self::TimestampMicros => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        }
    }
}

impl DecodingConfig {
    /// How the source decodes records.
    ///
    /// # Errors
    /// An Avro schema that does not parse, or Confluent framing without `schema_id`.
    pub fn decoding(&self) -> Result<Decoding> {
        Ok(match self {
            DecodingConfig::Text => Decoding::Text,
            DecodingConfig::Binary => Decoding::Binary,
            DecodingConfig::Json { fields } => Decoding::Json(json_schema(fields)),
            DecodingConfig::Avro {
                schema,
                framing,
                schema_id,
            } => {
                let framing = match (framing, schema_id) {
                    (AvroFramingConfig::Confluent, Some(schema_id)) => AvroFraming::Confluent {
                        schema_id: *schema_id,
                    },
                    (AvroFramingConfig::Confluent, None) => bail!(
                        "[source] decoding: framing = \"confluent\" needs schema_id, the declared schema's id in \
                         the schema registry"
                    ),
                    (AvroFramingConfig::SingleObject, _) => AvroFraming::SingleObject,
                };
                Decoding::Avro(AvroDecoding::new(schema, framing).context("[source] decoding")?)
            }
        })
    }
}

impl OnGap {
    /// The source's policy for it.
    pub fn policy(self) -> GapPolicy {
        match self {
            OnGap::Fail => GapPolicy::Fail,
            OnGap::Earliest => GapPolicy::Earliest,
        }
    }
}

/// Connection settings are the connection's, not the consumer's (they reach librdkafka through the connection).
pub fn is_connection_setting(key: &str) -> bool {
    ["security.", "ssl.", "sasl.", "enable.ssl"]
        .iter()
        .any(|p| key.starts_with(p))
}

fn json_schema(fields: &[FieldConfig]) -> SchemaRef {
    Arc::new(Schema::new(
        fields
            .iter()
            .map(|f| Field::new(&f.name, f.column_type.data_type(), f.nullable))
            .collect::<Vec<_>>(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(extra: &str) -> SourceConfig {
        toml::from_str(&format!(
            "bootstrap_servers = \"127.0.0.1:9092\"\ntopic = \"orders\"\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn a_json_key_becomes_prefixed_columns_after_the_value_fields() {
        let source = source(
            "decoding = { kind = \"json\", fields = [ { name = \"amount\", type = \"int64\" } ] }\n\
             [metadata]\nkey = \"key\"\noffset = \"kafka_offset\"\n\
             key_decoding = { kind = \"json\", fields = [ { name = \"customer\", type = \"string\" } ] }",
        );
        let schema = source
            .metadata_columns()
            .unwrap()
            .schema(&source.decoding.decoding().unwrap())
            .unwrap();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["amount", "kafka_offset", "key_customer"]);
    }

    #[test]
    fn headers_named_twice_or_a_key_decoding_without_a_key_is_refused() {
        let err = source("headers = true\n[metadata]\nheaders = \"h\"")
            .metadata_columns()
            .unwrap_err();
        assert!(err.to_string().contains("keep one"), "{err:#}");
        let err = source("[metadata]\nkey_decoding = { kind = \"binary\" }")
            .metadata_columns()
            .unwrap_err();
        assert!(err.to_string().contains("needs `key`"), "{err:#}");
        let columns = source("headers = true").metadata_columns().unwrap();
        assert_eq!(columns.headers.as_deref(), Some("headers"));
    }
}
