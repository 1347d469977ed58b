//! Writer schemas looked up in a schema registry by the id each Confluent-framed record carries, checked against
//! the reader schema (the columns follow it) before any record of them is decoded.
//!
//! A writer schema is accepted when arrow-avro can resolve it to the reader schema (Avro's schema resolution: a
//! field the writer lacks takes the reader's default, a type may be promoted, e.g. `int` to `long`) and it has no
//! field the reader schema lacks: such a field's values would be dropped without a word, so the record is refused
//! instead, naming the field and both schema ids. Refusals are [`BadRecord`](ErrorKind::BadRecord)s (a job with
//! dead letters sends the records there); a registry that cannot be reached is
//! [`Retryable`](ErrorKind::Retryable) and never dead-letters anything.
//!
//! Lookups happen on the consumer thread, which blocks on the async registry client through the handle of the
//! runtime the source was opened on (each lookup bounded and retried by the client). Ids are looked up once:
//! accepted schemas and refusals are remembered for the life of the source.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use connector_api::{Error, ErrorKind, Phase, Result};
use schema_registry::{RegisteredSchema, SchemaRegistry, SchemaType};
use serde_json::Value;

use crate::record::{RecordAt, bad_record};

/// The schema a registry-backed Avro decoding reads every record as: its fields are the columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderSchema {
    /// The Avro schema JSON.
    pub schema: String,
    /// Its id in the registry, when it came from there.
    pub id: Option<u32>,
    /// Where it came from, for messages: `the latest version (3) of subject orders-value`.
    pub origin: String,
}

impl ReaderSchema {
    /// The reader schema of `registered`, found as the latest version of its subject.
    pub fn latest(registered: &RegisteredSchema) -> Self {
        let origin = match &registered.version {
            Some((subject, version)) => {
                format!("the latest version ({version}) of subject {subject}")
            }
            None => "the registry".to_string(),
        };
        Self {
            schema: registered.schema.clone(),
            id: Some(registered.id),
            origin,
        }
    }

    /// A reader schema declared in the job.
    pub fn declared(schema: &str) -> Self {
        Self {
            schema: schema.to_string(),
            id: None,
            origin: "the declared reader schema".to_string(),
        }
    }

    fn named(&self) -> String {
        match self.id {
            Some(id) => format!("reader schema id {id} ({})", self.origin),
            None => self.origin.clone(),
        }
    }
}

/// Writer schemas by id, shared by every decoder of one decoding.
pub(crate) struct WriterSchemas {
    registry: SchemaRegistry,
    runtime: tokio::runtime::Handle,
    reader: ReaderSchema,
    known: Mutex<Known>,
}

impl std::fmt::Debug for WriterSchemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterSchemas")
            .field("registry", &self.registry)
            .field("reader", &self.reader.origin)
            .finish_non_exhaustive()
    }
}

/// The ids seen so far.
struct Known {
    store: SchemaStore,
    ids: BTreeSet<u32>,
    refused: HashMap<u32, String>,
}

impl WriterSchemas {
    /// Writer schemas from `registry`, read as `reader`; lookups block on `runtime`.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the reader schema does not parse.
    pub(crate) fn new(
        registry: SchemaRegistry,
        runtime: tokio::runtime::Handle,
        reader: ReaderSchema,
    ) -> Result<Self> {
        let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
        let mut ids = BTreeSet::new();
        // The reader schema's own records need no lookup (a declared one gets an id no record carries: 0 is
        // never a registry id, and the decoder is only asked for ids it was given).
        let id = reader.id.unwrap_or(0);
        store
            .set(Fingerprint::Id(id), AvroSchema::new(reader.schema.clone()))
            .map_err(|e| {
                Error::new(
                    ErrorKind::Config,
                    Phase::Setup,
                    format!("{} does not parse", reader.named()),
                )
                .with_source(e)
            })?;
        if reader.id.is_some() {
            ids.insert(id);
        }
        Ok(Self {
            registry,
            runtime,
            reader,
            known: Mutex::new(Known {
                store,
                ids,
                refused: HashMap::new(),
            }),
        })
    }

    /// The reader schema.
    pub(crate) fn reader(&self) -> &ReaderSchema {
        &self.reader
    }

    /// The accepted writer schemas (the reader's own among them) and their ids.
    pub(crate) fn snapshot(&self) -> (SchemaStore, BTreeSet<u32>) {
        let known = self.lock();
        (known.store.clone(), known.ids.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes sure writer schema `id`, which the record at `at` carries, is known and accepted.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record when the registry has no such id or the schema is
    /// refused (another schema type, references, a field the reader lacks, not resolvable to the reader);
    /// [`Retryable`](ErrorKind::Retryable) when the registry cannot be reached (after the client's retries), any
    /// other registry error as [`Config`](ErrorKind::Config).
    pub(crate) fn resolve(&self, id: u32, at: RecordAt<'_>) -> Result<()> {
        {
            let known = self.lock();
            if known.ids.contains(&id) {
                return Ok(());
            }
            if let Some(why) = known.refused.get(&id) {
                return Err(bad_record(at, why));
            }
        }
        let outcome = match self.runtime.block_on(self.registry.schema(id)) {
            Ok(writer) => self.check(&writer),
            Err(e) if e.is_not_found() => Err(format!(
                "carries schema id {id}, which the schema registry at {} does not have",
                self.registry.url()
            )),
            Err(e) => {
                return Err(Error::new(
                    e.kind(),
                    Phase::Write,
                    format!(
                        "cannot look up schema id {id} of record {}/{}@{}",
                        at.topic, at.partition, at.offset
                    ),
                )
                .with_source(e));
            }
        };
        let mut known = self.lock();
        match outcome {
            Ok(schema) => {
                known.store.set(Fingerprint::Id(id), schema).map_err(|e| {
                    bad_record(at, "has a writer schema that does not parse").with_source(e)
                })?;
                known.ids.insert(id);
                tracing::info!(id, reader = %self.reader.named(), "schema registry: new writer schema accepted");
                Ok(())
            }
            Err(why) => {
                tracing::warn!(id, %why, "schema registry: writer schema refused");
                known.refused.insert(id, why.clone());
                Err(bad_record(at, &why))
            }
        }
    }

    /// Whether `writer` may be read as the reader schema; why not, as the end of a sentence about a record.
    fn check(&self, writer: &RegisteredSchema) -> std::result::Result<AvroSchema, String> {
        let id = writer.id;
        let reader = self.reader.named();
        if writer.schema_type != SchemaType::Avro {
            return Err(format!(
                "is written with schema id {id}, a {} schema; this decoding reads Avro",
                writer.schema_type
            ));
        }
        if !writer.references.is_empty() {
            let names: Vec<&str> = writer.references.iter().map(|r| r.name.as_str()).collect();
            return Err(format!(
                "is written with schema id {id}, which refers to other subjects' schemas ({}); schema references \
                 are not resolved: register the schema with those types inlined",
                names.join(", ")
            ));
        }
        let parsed = |text: &str| serde_json::from_str::<Value>(text);
        let (Ok(writer_json), Ok(reader_json)) =
            (parsed(&writer.schema), parsed(&self.reader.schema))
        else {
            return Err(format!(
                "is written with schema id {id}, which is not Avro schema JSON"
            ));
        };
        let mut added = Vec::new();
        added_fields(&writer_json, &reader_json, "", &mut added);
        if !added.is_empty() {
            return Err(format!(
                "is written with schema id {id}, which has field{} {} that {reader} lacks; the job stops rather \
                 than drop {}",
                if added.len() == 1 { "" } else { "s" },
                added
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if added.len() == 1 {
                    "its values"
                } else {
                    "their values"
                },
            ));
        }
        let schema = AvroSchema::new(writer.schema.clone());
        let mut alone = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
        alone
            .set(Fingerprint::Id(id), schema.clone())
            .and_then(|_| {
                arrow_avro::reader::ReaderBuilder::new()
                    .with_writer_schema_store(alone)
                    .with_reader_schema(AvroSchema::new(self.reader.schema.clone()))
                    .build_decoder()
            })
            .map_err(|e| {
                format!("is written with schema id {id}, which cannot be read as {reader}: {e}")
            })?;
        Ok(schema)
    }
}

/// Paths of the fields `writer` has and `reader` lacks (by name or alias), in records nested through fields,
/// unions, arrays and maps. A type referred to by name is not followed (its definition was compared where it
/// appeared).
fn added_fields(writer: &Value, reader: &Value, path: &str, out: &mut Vec<String>) {
    match (writer, reader) {
        (Value::Array(branches), _) => {
            for branch in branches {
                if let Some(matching) = counterpart(branch, reader) {
                    added_fields(branch, matching, path, out);
                }
            }
        }
        (Value::Object(w), _) => {
            let Some(r) = counterpart(writer, reader).and_then(Value::as_object) else {
                return;
            };
            match w.get("type").and_then(Value::as_str) {
                Some("record") => {
                    let fields = |o: &serde_json::Map<String, Value>| {
                        o.get("fields")
                            .and_then(Value::as_array)
                            .cloned()
                            .unwrap_or_default()
                    };
                    let reader_fields = fields(r);
                    for field in fields(w) {
                        let Some(name) = field.get("name").and_then(Value::as_str) else {
                            continue;
                        };
                        let full = if path.is_empty() {
                            name.to_string()
                        } else {
                            format!("{path}.{name}")
                        };
                        let matching = reader_fields.iter().find(|f| {
                            f.get("name").and_then(Value::as_str) == Some(name)
                                || f.get("aliases")
                                    .and_then(Value::as_array)
                                    .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(name)))
                        });
                        match matching {
                            None => out.push(full),
                            Some(m) => added_fields(&field["type"], &m["type"], &full, out),
                        }
                    }
                }
                Some("array") => added_fields(&w["items"], &r["items"], &format!("{path}[]"), out),
                Some("map") => {
                    added_fields(&w["values"], &r["values"], &format!("{path}{{}}"), out)
                }
                _ => {}
            }
        }
        _ => {}
    }
}

/// The part of `reader` (itself, or a branch of a union) that corresponds to `writer`: the same complex type,
/// and for records the same name or, failing that, the only record.
fn counterpart<'r>(writer: &Value, reader: &'r Value) -> Option<&'r Value> {
    let kind = |v: &Value| v.get("type").and_then(Value::as_str).map(str::to_string);
    let name = |v: &Value| v.get("name").and_then(Value::as_str).map(str::to_string);
    let candidates: Vec<&Value> = match reader {
        Value::Array(branches) => branches.iter().collect(),
        other => vec![other],
    };
    let same_kind: Vec<&Value> = candidates
        .into_iter()
        .filter(|c| c.is_object() && kind(c) == kind(writer))
        .collect();
    same_kind
        .iter()
        .find(|c| name(c) == name(writer))
        .or_else(|| (same_kind.len() == 1).then(|| &same_kind[0]))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(writer: &str, reader: &str) -> Vec<String> {
        let mut out = Vec::new();
        added_fields(
            &serde_json::from_str(writer).unwrap(),
            &serde_json::from_str(reader).unwrap(),
            "",
            &mut out,
        );
        out
    }

    #[test]
    fn fields_the_reader_lacks_are_found_at_any_depth() {
        let reader = r#"{"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},
            {"name":"customer","type":["null",{"type":"record","name":"C","fields":[{"name":"name","type":"string"}]}]},
            {"name":"lines","type":{"type":"array","items":{"type":"record","name":"L","fields":[{"name":"sku","type":"string"}]}}},
            {"name":"amount","type":"long","aliases":["total"]}]}"#;
        assert!(added(reader, reader).is_empty());
        let writer = r#"{"type":"record","name":"O","fields":[
            {"name":"id","type":"long"},
            {"name":"note","type":["null","string"],"default":null},
            {"name":"customer","type":["null",{"type":"record","name":"C","fields":[{"name":"name","type":"string"},{"name":"email","type":"string"}]}]},
            {"name":"lines","type":{"type":"array","items":{"type":"record","name":"L","fields":[{"name":"sku","type":"string"},{"name":"qty","type":"int"}]}}},
            {"name":"total","type":"long"}]}"#;
        assert_eq!(
            added(writer, reader),
            ["note", "customer.email", "lines[].qty"]
        );
        // A writer lacking a reader field is Avro resolution's business (the default), not an added field.
        let fewer = r#"{"type":"record","name":"O","fields":[{"name":"id","type":"long"}]}"#;
        assert!(added(fewer, reader).is_empty());
    }
}
