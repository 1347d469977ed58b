//! The source's settings as a job file writes them (`[source]` of Ratchet's worker, or any TOML or JSON an
//! embedding job deserializes): the Kafka topics, how records become rows, which metadata become columns, what a
//! gap in the log means, and the schema registry; resolved into the [`Decoding`], [`MetadataColumns`] and
//! [`KafkaSourceOptions`] the reader takes. Every refusal is a [`Config`](ErrorKind::Config) error naming the
//! setting and what to change.
//!
//! | key | meaning | default |
//! |---|---|---|
//! | `bootstrap_servers` | Kafka bootstrap servers | required |
//! | `topic` / `topics` / `topic_pattern` | what is read: exactly one of the three | required |
//! | `decoding` | `{ kind = "text" \| "binary" \| "json" \| "json-schema" \| "avro" \| "debezium", ... }` | `text` |
//! | `headers` | add a `headers` column | false |
//! | `[metadata]` | `topic`, `partition`, `offset`, `timestamp`, `key` (+ `key_decoding`), `headers` columns | none |
//! | `batch_rows` | rows per batch at most | the reader's |
//! | `client` | librdkafka settings (connection and consumer tuning) | none |
//! | `on_gap` | `fail` or `earliest` for records removed before they were read | `fail` |
//! | `metadata_refresh` | how often partitions and topics are looked for | 30 s |
//! | `[registry]` | the schema registry Avro writer schemas and JSON Schemas come from | none |
//! | `lag_group` | the consumer group decided positions are also committed to | the job's choice |

use std::collections::BTreeMap;
use std::time::Duration;

use connector_api::{Error, ErrorKind, Evolution, Result};
use schema_registry::{RegistrySettings, SchemaRegistry, SubjectStrategy};
use serde::Deserialize;

use crate::{
    AvroDecoding, AvroFraming, DebeziumDecoding, Decoding, GapPolicy, JsonDecoding, JsonField,
    JsonSchemaDecoding, KafkaConnection, KafkaSourceOptions, KeyDecoding, MetadataColumns,
    ProtobufDecoding, ReaderSchema, TopicSelection, Truncate, UnknownFields,
};

/// Refuses with a [`Config`](ErrorKind::Config) error: `refuse!(format-args)`.
macro_rules! refuse {
    ($($arg:tt)*) => {
        return Err(Error::config(format!($($arg)*)))
    };
}

/// `[source]`: Kafka topics, read with `isolation.level=read_committed` from the checkpointed positions.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceSettings {
    /// Kafka bootstrap servers.
    pub bootstrap_servers: String,
    /// The topic (or `topics`, or `topic_pattern`: exactly one of the three; [`selection`](Self::selection)).
    #[serde(default)]
    pub topic: Option<String>,
    /// Several topics, read as one stream (each batch of one topic; the `topic` metadata column tells them apart).
    #[serde(default)]
    pub topics: Option<Vec<String>>,
    /// Every topic whose whole name matches this regular expression, including topics created while the job runs
    /// (found within `metadata_refresh`).
    #[serde(default)]
    pub topic_pattern: Option<String>,
    /// How records become rows (`text` by default).
    #[serde(default)]
    pub decoding: DecodingSettings,
    /// Add a `headers` column (the same as `metadata.headers = "headers"`).
    #[serde(default)]
    pub headers: bool,
    /// Record metadata as columns after the decoding's (`[source.metadata]`).
    #[serde(default)]
    pub metadata: MetadataSettings,
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
    /// The schema registry Avro writer schemas are looked up in (`[source.registry]`; absent: declared schemas).
    #[serde(default)]
    pub registry: Option<RegistrySettings>,
    /// The Kafka consumer group decided positions are also committed to, for lag in the usual tools
    /// (informational, never read back; Ratchet's worker defaults it to `ratchet.<job>`, `""` for none).
    #[serde(default)]
    pub lag_group: Option<String>,
}

/// `[source.metadata]`: which record metadata becomes columns, each under the name given (absent: not added).
/// Types and null rules: docs/worker.md, "Record metadata as columns".
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataSettings {
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
    pub key_decoding: Option<DecodingSettings>,
    /// Its headers (`Map<Utf8, Binary>`).
    pub headers: Option<String>,
}

impl KafkaSourceSettings {
    /// The connection to the source's cluster: the bootstrap servers and the `client` settings that say how to
    /// reach it.
    ///
    /// # Errors
    /// A connection setting that cannot be honoured, named.
    pub fn connection(&self) -> Result<KafkaConnection> {
        KafkaConnection::new(&self.bootstrap_servers, &self.client)
            .map_err(|e| e.context("[source]"))
    }

    /// The reader's options with `decoding` and `metadata` (from [`decodings`](Self::decodings)): the consumer's
    /// own `client` settings, the gap policy, the metadata refresh and the batch size. Which partitions it reads
    /// (`share`) and whether bad records are diverted are the caller's.
    pub fn options(&self, decoding: Decoding, metadata: MetadataColumns) -> KafkaSourceOptions {
        let mut options = KafkaSourceOptions {
            decoding,
            metadata,
            client: self
                .client
                .iter()
                .filter(|(k, _)| !is_connection_setting(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            on_gap: self.on_gap.policy(),
            metadata_refresh: self.metadata_refresh,
            ..KafkaSourceOptions::default()
        };
        if let Some(rows) = self.batch_rows {
            options.batch_rows = rows;
        }
        options
    }

    /// What the source reads: exactly one of `topic`, `topics` (not empty, no topic twice) or `topic_pattern`.
    ///
    /// # Errors
    /// None or several of the three, an empty or repeating list, a pattern that is not a regular expression.
    pub fn selection(&self) -> Result<TopicSelection> {
        match (&self.topic, &self.topics, &self.topic_pattern) {
            (Some(topic), None, None) => Ok(TopicSelection::One(topic.clone())),
            (None, Some(topics), None) => {
                if topics.is_empty() {
                    refuse!("[source] topics is empty: name at least one topic");
                }
                if let Some(twice) = topics
                    .iter()
                    .enumerate()
                    .find(|(i, t)| topics[..*i].contains(t))
                {
                    refuse!("[source] topics names {:?} twice", twice.1);
                }
                Ok(TopicSelection::List(topics.clone()))
            }
            (None, None, Some(pattern)) => {
                TopicSelection::pattern(pattern).map_err(|e| e.context("[source] topic_pattern"))
            }
            _ => refuse!(
                "[source] names what it reads with exactly one of topic = \"..\", topics = [\"..\", ..] or \
                 topic_pattern = \"<regular expression>\""
            ),
        }
    }

    /// The one topic the source reads, when it reads exactly one (`topic`, or `topics` of one).
    pub fn single_topic(&self) -> Option<&str> {
        match (&self.topic, &self.topics) {
            (Some(topic), _) => Some(topic),
            (None, Some(topics)) if topics.len() == 1 && self.topic_pattern.is_none() => {
                Some(&topics[0])
            }
            _ => None,
        }
    }

    /// The value decoding and the metadata columns, when they need no registry lookup; `None` when they do
    /// (see [`decodings`](Self::decodings)).
    ///
    /// # Errors
    /// As [`decodings`](Self::decodings), less what only the registry can tell.
    pub fn offline_decodings(&self) -> Result<Option<(Decoding, MetadataColumns)>> {
        if self.schema_registry()?.is_some() {
            return Ok(None);
        }
        let value = self
            .decoding
            .declared()
            .map_err(|e| e.context("[source] decoding"))?;
        let key = match self.declared_key() {
            Some(key) => Some(
                key.declared()
                    .map_err(|e| e.context("[source.metadata] key_decoding"))?,
            ),
            None => None,
        };
        Ok(Some((value, self.metadata_columns(key)?)))
    }

    /// The value decoding and the metadata columns, a registry's reader schemas looked up (the latest version of
    /// each subject, unless a reader schema is declared).
    ///
    /// # Errors
    /// A decoding that does not parse; a subject the registry does not have, or a registry that cannot be
    /// reached (after retries); the metadata errors of `metadata_columns`.
    ///
    /// `evolution` is the job's (its least evolving sink's): with `add-columns` or more, a registry-backed value
    /// decoding (Avro, JSON Schema, Protobuf) widens its columns when a writer schema adds (top-level) fields; with
    /// `evolve`, a registry-backed Avro decoding also widens a field's type and makes a field optional the way a
    /// writer schema does. The key's decoding never evolves.
    pub async fn decodings(&self, evolution: Evolution) -> Result<(Decoding, MetadataColumns)> {
        let registry = self.schema_registry()?;
        let lookup = |is_key| {
            registry.as_ref().map(|registry| Lookup {
                registry,
                topic: self.single_topic(),
                is_key,
                evolution: if is_key { Evolution::None } else { evolution },
            })
        };
        let value = self
            .decoding
            .resolve(lookup(false))
            .await
            .map_err(|e| e.context("[source] decoding"))?;
        let key = match self.declared_key() {
            Some(key) => Some(
                key.resolve(lookup(true))
                    .await
                    .map_err(|e| e.context("[source.metadata] key_decoding"))?,
            ),
            None => None,
        };
        Ok((value, self.metadata_columns(key)?))
    }

    /// The registry client of `[source.registry]`, when set.
    ///
    /// # Errors
    /// Settings that cannot make a client; a registry that no Avro decoding uses.
    pub fn schema_registry(&self) -> Result<Option<SchemaRegistry>> {
        let Some(settings) = &self.registry else {
            return Ok(None);
        };
        let avro = |d: &DecodingSettings| {
            matches!(
                d,
                DecodingSettings::Avro { .. }
                    | DecodingSettings::JsonSchema { .. }
                    | DecodingSettings::Protobuf { .. }
                    | DecodingSettings::Debezium {
                        converter: DebeziumConverter::Avro,
                        ..
                    }
            )
        };
        if !avro(&self.decoding) && !self.declared_key().is_some_and(avro) {
            refuse!(
                "[source.registry] is set, but neither `decoding` nor `metadata.key_decoding` reads from it: remove \
                 it, or use kind = \"avro\", \"json-schema\", \"protobuf\" (or kind = \"debezium\" with converter = \"avro\")"
            );
        }
        Ok(Some(SchemaRegistry::new(settings).map_err(|e| {
            Error::config("[source.registry]").with_source(e)
        })?))
    }

    /// The key's decoding when it is JSON or Avro.
    fn declared_key(&self) -> Option<&DecodingSettings> {
        self.metadata
            .key_decoding
            .as_ref()
            .filter(|d| !matches!(d, DecodingSettings::Text | DecodingSettings::Binary))
    }

    /// The metadata columns `[source]` asks for (`headers = true` is `metadata.headers = "headers"`), the key
    /// decoded as `key` when it is JSON or Avro.
    ///
    /// # Errors
    /// Both `headers = true` and `metadata.headers`; `key_decoding` without `key`.
    fn metadata_columns(&self, key: Option<Decoding>) -> Result<MetadataColumns> {
        let metadata = &self.metadata;
        let headers = match (self.headers, &metadata.headers) {
            (true, Some(name)) => refuse!(
                "[source] sets both `headers = true` and `metadata.headers = {name:?}`: keep one (`headers = true` \
                 is the column `headers`)"
            ),
            (true, None) => Some("headers".to_string()),
            (false, name) => name.clone(),
        };
        let key = match (&metadata.key, &metadata.key_decoding) {
            (None, Some(_)) => {
                refuse!(
                    "[source.metadata] key_decoding needs `key`, the name of the key column (or column prefix)"
                )
            }
            (None, None) => None,
            (Some(name), decoding) => {
                let decoding = match (decoding, key) {
                    (_, Some(declared)) => KeyDecoding::Declared(declared),
                    (Some(DecodingSettings::Binary), None) => KeyDecoding::Binary,
                    _ => KeyDecoding::Text,
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

/// Where a registry-backed decoding looks its schemas up: the registry, and the topic and side (key or value)
/// that name the subject.
struct Lookup<'a> {
    registry: &'a SchemaRegistry,
    /// The topic a `topic-name` subject is named after (`None`: the source reads several).
    topic: Option<&'a str>,
    is_key: bool,
    /// How far the reader schema follows a writer's changes.
    evolution: Evolution,
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
pub enum DecodingSettings {
    /// `topic`, `partition`, `offset`, `key`, `value`; key and value as UTF-8 text.
    #[default]
    Text,
    /// The same with key and value as bytes.
    Binary,
    /// Each value a JSON object decoded into the declared fields, exactly (`kafka_source::JsonField`).
    Json {
        /// The columns, in order.
        fields: Vec<JsonField>,
        /// What a key the fields do not declare means (default `ignore`; `fail`: a bad record).
        #[serde(default)]
        unknown_fields: UnknownFields,
    },
    /// Each value one Avro record: of the declared writer schema, or of the writer schema its Confluent framing
    /// names, looked up in `[source.registry]`; the columns follow the (reader) schema's fields.
    Avro {
        /// The writer schema (Avro schema JSON); with a registry, the reader schema (default: the subject's
        /// latest version).
        #[serde(default)]
        schema: Option<String>,
        /// How values frame the Avro body (`confluent` with a registry).
        #[serde(default)]
        framing: Option<AvroFramingSettings>,
        /// The declared schema's id in the registry (`framing = "confluent"` without a registry).
        #[serde(default)]
        schema_id: Option<u32>,
        /// How the subject of the latest schema is named (with a registry; default `topic-name`).
        #[serde(default)]
        subject_strategy: Option<SubjectStrategy>,
        /// The record's full name, for the `record-name` and `topic-record-name` strategies.
        #[serde(default)]
        record_name: Option<String>,
    },
    /// Each value one JSON document in Confluent framing whose JSON Schema `[source.registry]` has: validated
    /// against the schema its id names, decoded into the columns of the subject's latest schema
    /// (`kafka_source::JsonSchemaDecoding`).
    JsonSchema {
        /// How the subject of the latest schema is named (default `topic-name`).
        #[serde(default)]
        subject_strategy: Option<SubjectStrategy>,
        /// The schema's title, for the `record-name` and `topic-record-name` strategies.
        #[serde(default)]
        record_name: Option<String>,
        /// What a key the schema's properties do not declare means (default `fail`: a bad record naming it, as
        /// JSON Schema admits undeclared properties unless `additionalProperties` is false; `ignore` leaves it
        /// out).
        #[serde(default = "fail_unknown")]
        unknown_fields: UnknownFields,
    },
    /// Each value one Protobuf message in Confluent framing whose schema `[source.registry]` has: decoded with
    /// the schema its id names into the columns of the subject's latest schema's message
    /// (`kafka_source::ProtobufDecoding`).
    Protobuf {
        /// How the subject of the latest schema is named (default `topic-name`).
        #[serde(default)]
        subject_strategy: Option<SubjectStrategy>,
        /// The message's full name (`shop.Order`): the message of the latest schema the columns come from
        /// (default: its file's first message), and the record name of the `record-name` strategies.
        #[serde(default)]
        record_name: Option<String>,
    },
    /// Each value one Debezium change event: rows of the table's columns (after the change; before it for a
    /// delete) and the change columns (`__op`, `__source_*`), which keyed sinks apply and appending sinks keep.
    Debezium {
        /// How the events were written (default `json`).
        #[serde(default)]
        converter: DebeziumConverter,
        /// JSON: the converter's `schemas.enable` (default true, as Kafka Connect's).
        #[serde(default = "yes")]
        schemas: bool,
        /// JSON: the table's columns, in order (the Avro converter's come from the registry).
        #[serde(default)]
        fields: Vec<JsonField>,
        /// JSON: what a column of the row images that `fields` do not declare means (default `ignore`).
        #[serde(default)]
        unknown_fields: UnknownFields,
        /// The connector's `unavailable.value.placeholder` (default `__debezium_unavailable_value`).
        #[serde(default)]
        unavailable_placeholder: Option<String>,
        /// What a truncate event does: `apply` (default; keyed sinks delete every row) or `refuse`.
        #[serde(default)]
        truncate: Truncate,
    },
}

/// `converter` of the Debezium decoding: how Kafka Connect wrote the change events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DebeziumConverter {
    /// `org.apache.kafka.connect.json.JsonConverter`.
    #[default]
    Json,
    /// An Avro converter writing Confluent-framed records through `[source.registry]`.
    Avro,
}

fn yes() -> bool {
    true
}

fn fail_unknown() -> UnknownFields {
    UnknownFields::Fail
}

/// `framing` of the Avro decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AvroFramingSettings {
    /// Confluent Schema Registry's wire format: `0x00`, the 4-byte schema id, the body.
    Confluent,
    /// Avro's single-object encoding: `0xC3 0x01`, the schema's Rabin fingerprint, the body.
    SingleObject,
}

impl DecodingSettings {
    /// How the source decodes records with declared schemas only.
    ///
    /// # Errors
    /// An Avro schema that does not parse, no Avro schema, Confluent framing without `schema_id`, or settings
    /// that only mean something with a registry.
    pub fn declared(&self) -> Result<Decoding> {
        Ok(match self {
            DecodingSettings::Text => Decoding::Text,
            DecodingSettings::Binary => Decoding::Binary,
            DecodingSettings::Json {
                fields,
                unknown_fields,
            } => Decoding::Json(JsonDecoding::declared(fields, *unknown_fields)?),
            DecodingSettings::Debezium {
                converter: DebeziumConverter::Json,
                schemas,
                fields,
                ..
            } => {
                if fields.is_empty() {
                    refuse!(
                        "kind = \"debezium\" with the JSON converter needs `fields`: the captured table's \
                         columns (name, type), as the change events' `after` holds them"
                    );
                }
                let columns = JsonDecoding::declared(fields, UnknownFields::Ignore)?.schema();
                Decoding::Debezium(
                    self.debezium_settings(DebeziumDecoding::json(columns, *schemas)),
                )
            }
            DecodingSettings::JsonSchema { .. } => refuse!(
                "kind = \"json-schema\" reads each record's JSON Schema from a schema registry: add \
                 [source.registry]"
            ),
            DecodingSettings::Protobuf { .. } => refuse!(
                "kind = \"protobuf\" reads each record's Protobuf schema from a schema registry: add \
                 [source.registry]"
            ),
            DecodingSettings::Debezium {
                converter: DebeziumConverter::Avro,
                ..
            } => refuse!(
                "kind = \"debezium\" with converter = \"avro\" reads each event's schema from a schema registry: \
                 add [source.registry]"
            ),
            DecodingSettings::Avro {
                schema,
                framing,
                schema_id,
                subject_strategy,
                record_name,
            } => {
                if subject_strategy.is_some() || record_name.is_some() {
                    refuse!(
                        "subject_strategy and record_name name a registry's subjects: add [source.registry], or \
                         remove them"
                    );
                }
                let Some(schema) = schema else {
                    refuse!(
                        "kind = \"avro\" needs `schema` (the writer schema, Avro schema JSON), or a \
                         [source.registry] to look each record's schema up in"
                    );
                };
                let framing = match (framing, schema_id) {
                    (Some(AvroFramingSettings::Confluent), Some(schema_id)) => {
                        AvroFraming::Confluent {
                            schema_id: *schema_id,
                        }
                    }
                    (Some(AvroFramingSettings::Confluent), None) => refuse!(
                        "framing = \"confluent\" needs schema_id, the declared schema's id in the schema \
                         registry (or a [source.registry] to look ids up in)"
                    ),
                    (Some(AvroFramingSettings::SingleObject), _) => AvroFraming::SingleObject,
                    (None, _) => refuse!(
                        "kind = \"avro\" needs framing = \"confluent\" or \"single-object\" (how each value frames \
                         its Avro body)"
                    ),
                };
                Decoding::Avro(AvroDecoding::new(schema, framing)?)
            }
        })
    }

    /// `decoding` with the Debezium settings of this decoding (placeholder, truncate, unknown columns).
    fn debezium_settings(&self, decoding: DebeziumDecoding) -> DebeziumDecoding {
        let DecodingSettings::Debezium {
            unknown_fields,
            unavailable_placeholder,
            truncate,
            ..
        } = self
        else {
            return decoding;
        };
        let decoding = decoding
            .with_truncate(*truncate)
            .with_unknown_fields(*unknown_fields);
        match unavailable_placeholder {
            Some(placeholder) => decoding.with_placeholder(placeholder.clone()),
            None => decoding,
        }
    }

    /// How the source decodes records, Avro writer schemas looked up through `lookup` when given.
    ///
    /// # Errors
    /// As [`declared`](Self::declared); with a registry, single-object framing or a `schema_id`, a subject
    /// without schemas, a registry that cannot be reached (after retries) or refuses.
    async fn resolve(&self, lookup: Option<Lookup<'_>>) -> Result<Decoding> {
        if let DecodingSettings::Debezium {
            converter, fields, ..
        } = self
        {
            if lookup.as_ref().is_some_and(|l| l.is_key) {
                refuse!("kind = \"debezium\" decodes values: decode the key as json or avro");
            }
            let (DebeziumConverter::Avro, Some(lookup)) = (converter, lookup) else {
                return self.declared();
            };
            if !fields.is_empty() {
                refuse!(
                    "with converter = \"avro\" the table's columns come from the registry's envelope schema: \
                     remove `fields`"
                );
            }
            let reader = ReaderSchema::latest(&latest_schema(&lookup, None, None).await?);
            // A captured table's new column is a field of the nested row records, which the reader schema does
            // not widen into (planned): the reader stays the envelope schema the job started with.
            let avro =
                AvroDecoding::for_change_events(lookup.registry.clone(), reader, lookup.evolution)?;
            return Ok(Decoding::Debezium(
                self.debezium_settings(DebeziumDecoding::avro(avro)?),
            ));
        }
        if let (
            DecodingSettings::JsonSchema {
                subject_strategy,
                record_name,
                unknown_fields,
            },
            Some(lookup),
        ) = (self, lookup.as_ref())
        {
            let latest = latest_schema(lookup, *subject_strategy, record_name.as_deref()).await?;
            if latest.schema_type != schema_registry::SchemaType::Json {
                refuse!(
                    "kind = \"json-schema\" reads JSON Schema, but the reader schema, {}, is a {} schema: pick \
                     the kind its producers write (kind = \"avro\" for AVRO)",
                    ReaderSchema::latest(&latest).named(),
                    latest.schema_type
                );
            }
            return Ok(Decoding::JsonSchema(JsonSchemaDecoding::from_registry(
                lookup.registry.clone(),
                ReaderSchema::latest(&latest),
                *unknown_fields,
                lookup.evolution,
            )?));
        }
        if let (
            DecodingSettings::Protobuf {
                subject_strategy,
                record_name,
            },
            Some(lookup),
        ) = (self, lookup.as_ref())
        {
            let latest = latest_schema(lookup, *subject_strategy, record_name.as_deref()).await?;
            let reader = ReaderSchema::latest(&latest);
            if latest.schema_type != schema_registry::SchemaType::Protobuf {
                refuse!(
                    "kind = \"protobuf\" reads Protobuf, but the reader schema, {}, is a {} schema: pick the \
                     kind its producers write",
                    reader.named(),
                    latest.schema_type
                );
            }
            let file = schema_registry::protobuf::compile(lookup.registry, &latest)
                .await
                .map_err(|e| {
                    let kind = match &e {
                        schema_registry::protobuf::ProtobufSchemaError::Registry {
                            source, ..
                        } if !source.is_not_found() => ErrorKind::Retryable,
                        _ => ErrorKind::Config,
                    };
                    Error::new(
                        kind,
                        connector_api::Phase::Setup,
                        format!("the reader schema, {}, cannot be read: {e}", reader.named()),
                    )
                })?;
            let decoding = ProtobufDecoding::from_registry(
                lookup.registry.clone(),
                reader,
                &file,
                record_name.as_deref(),
                lookup.evolution,
            )?;
            let names = match file.parent_pool().get_message_by_name(decoding.message()) {
                Some(message) => {
                    crate::renames::protobuf_column_names(lookup.registry, &latest, &message)
                        .await?
                }
                None => Default::default(),
            };
            return Ok(Decoding::Protobuf(decoding.keeping_column_names(&names)));
        }
        let (
            DecodingSettings::Avro {
                schema,
                framing,
                schema_id,
                subject_strategy,
                record_name,
            },
            Some(lookup),
        ) = (self, lookup)
        else {
            return self.declared();
        };
        if *framing == Some(AvroFramingSettings::SingleObject) {
            refuse!(
                "framing = \"single-object\" carries schema fingerprints, not registry ids: with \
                 [source.registry] use framing = \"confluent\""
            );
        }
        if schema_id.is_some() {
            refuse!(
                "with [source.registry] each record's schema id is looked up: remove schema_id (a declared \
                 `schema` is then the reader schema)"
            );
        }
        let reader = match schema {
            Some(schema) => ReaderSchema::declared(schema),
            None => {
                let latest =
                    latest_schema(&lookup, *subject_strategy, record_name.as_deref()).await?;
                ReaderSchema {
                    schema: crate::renames::avro_reader(lookup.registry, &latest).await?,
                    ..ReaderSchema::latest(&latest)
                }
            }
        };
        Ok(Decoding::Avro(AvroDecoding::from_registry(
            lookup.registry.clone(),
            reader,
            lookup.evolution,
        )?))
    }
}

/// The latest schema of the subject `strategy` names for `lookup`'s topic.
///
/// # Errors
/// A subject the registry does not have (naming it and what to do), a registry that cannot be reached or refuses.
async fn latest_schema(
    lookup: &Lookup<'_>,
    strategy: Option<SubjectStrategy>,
    record_name: Option<&str>,
) -> Result<schema_registry::RegisteredSchema> {
    let strategy = strategy.unwrap_or_default();
    let topic = match (lookup.topic, strategy) {
        (Some(topic), _) => topic,
        (None, SubjectStrategy::RecordName) => "",
        (None, _) => refuse!(
            "the source reads several topics, so the reader schema cannot be looked up under a subject named after \
             the topic: set subject_strategy = \"record-name\" (with record_name), or declare the reader `schema`"
        ),
    };
    let subject = strategy
        .subject(topic, lookup.is_key, record_name)
        .map_err(|e| Error::config("the reader schema's subject").with_source(e))?;
    lookup.registry.latest(&subject).await.map_err(|e| {
        let hint = if e.is_not_found() {
            format!(
                ": register a schema under subject {subject}, declare the reader `schema`, or pick the \
                 subject_strategy its producers use"
            )
        } else {
            String::new()
        };
        let kind = if e.is_not_found() {
            ErrorKind::Config
        } else {
            ErrorKind::Retryable
        };
        Error::new(
            kind,
            connector_api::Phase::Setup,
            format!("cannot find the latest schema of subject {subject} in the schema registry{hint}"),
        )
        .with_source(e)
    })
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

/// Whether a `client` setting says how to reach the cluster ([`kafka_connection::CONNECTION_PREFIXES`]): the
/// connection's, given to every client, not the consumer's tuning.
pub fn is_connection_setting(key: &str) -> bool {
    kafka_connection::CONNECTION_PREFIXES
        .iter()
        .any(|p| key.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(extra: &str) -> KafkaSourceSettings {
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
        let (decoding, metadata) = source.offline_decodings().unwrap().unwrap();
        let schema = metadata.schema(&decoding).unwrap();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["amount", "kafka_offset", "key_customer"]);
    }

    #[test]
    fn headers_named_twice_or_a_key_decoding_without_a_key_is_refused() {
        let err = source("headers = true\n[metadata]\nheaders = \"h\"")
            .offline_decodings()
            .unwrap_err();
        assert!(err.to_string().contains("keep one"), "{err:#}");
        let err = source("[metadata]\nkey_decoding = { kind = \"binary\" }")
            .offline_decodings()
            .unwrap_err();
        assert!(err.to_string().contains("needs `key`"), "{err:#}");
        let (_, columns) = source("headers = true")
            .offline_decodings()
            .unwrap()
            .unwrap();
        assert_eq!(columns.headers.as_deref(), Some("headers"));
    }

    #[test]
    fn avro_settings_that_need_a_registry_or_contradict_one_are_refused() {
        let registry = "[registry]\nurl = \"http://127.0.0.1:1/apis/ccompat/v7\"\n";
        let avro = |settings: &str| format!("decoding = {{ kind = \"avro\"{settings} }}\n");
        let schema =
            r#", schema = '{"type":"record","name":"R","fields":[{"name":"id","type":"long"}]}'"#;
        for (text, expected) in [
            (avro(""), "needs `schema`"),
            (
                avro(&format!("{schema}, framing = \"confluent\"")),
                "needs schema_id",
            ),
            (avro(schema), "needs framing"),
            (
                avro(&format!(
                    "{schema}, framing = \"single-object\", subject_strategy = \"record-name\""
                )),
                "add [source.registry]",
            ),
            (
                "decoding = { kind = \"json\", fields = [] }\n".to_string() + registry,
                "neither",
            ),
        ] {
            let err = source(&text).offline_decodings().unwrap_err();
            assert!(format!("{err:#}").contains(expected), "{text}: {err:#}");
        }
        // With a registry, resolving is the registry's business: nothing offline to say.
        let with_registry = source(&(avro("") + registry));
        assert!(with_registry.offline_decodings().unwrap().is_none());
    }

    #[tokio::test]
    async fn a_registry_refuses_single_object_framing_and_a_fixed_id() {
        let registry = "[registry]\nurl = \"http://127.0.0.1:1/apis/ccompat/v7\"\n";
        for (settings, expected) in [
            (", framing = \"single-object\"", "framing = \"confluent\""),
            (", schema_id = 4", "remove schema_id"),
        ] {
            let text = format!("decoding = {{ kind = \"avro\"{settings} }}\n{registry}");
            let err = source(&text).decodings(Evolution::None).await.unwrap_err();
            assert!(format!("{err:#}").contains(expected), "{text}: {err:#}");
        }
    }
}
