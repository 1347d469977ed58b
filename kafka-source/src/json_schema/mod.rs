//! JSON Schema through the schema registry: each value is Confluent-framed (`0x00`, the 4-byte big-endian schema id,
//! the JSON document, as confluent-kafka's `JSONSerializer` writes it). The reader schema (the subject's latest
//! version) gives the columns ([`columns`]: its root object's properties, decoded exactly as declared JSON fields
//! are); every record is validated against the schema its id names before it is decoded.
//!
//! A record is a [`BadRecord`](ErrorKind::BadRecord) (dead-lettered when the job has a dead-letter topic) when it
//! is not framed, its id is not a JSON Schema the registry has, it is not JSON, it violates its schema (the error
//! names the JSON pointer of each violation, up to three), or a value does not fit its column exactly. A writer
//! schema with properties the reader lacks is refused, naming them and both ids (their values would otherwise be
//! dropped), unless the decoding evolves: with every sink's `evolution = "add-columns"` new top-level properties
//! become nullable columns, and with `"evolve"` also properties added inside objects and required properties made
//! optional, in a new *generation* of the columns whose batches the source hands out as a schema change
//! ([`KafkaSource::schema_change`](crate::KafkaSource::schema_change)).

mod bounds;
mod columns;
mod doc;
mod implied;
mod inline;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow_schema::SchemaRef;
use connector_api::{Error, ErrorKind, Evolution, Phase, Result};
use schema_registry::{RegisteredSchema, SchemaRegistry, SchemaType};

use crate::json_rows::{Read, UnknownFields};
use crate::json_types::{JsonDecoding, JsonField, JsonItem};
use crate::record::{RecordAt, bad_record};
use crate::registry_lookup::{RegistryLookup, confluent_id, self_contained};
use crate::writer_schemas::ReaderSchema;
use bounds::Bounds;
use doc::Doc;

/// How many violations of one record its error names.
const VIOLATIONS_NAMED: usize = 3;

/// The JSON Schema decoding: the reader schema's columns (widened as writers add properties, when it evolves), and
/// the writer schemas by id that validate each record.
#[derive(Debug, Clone)]
pub struct JsonSchemaDecoding {
    writers: Arc<JsonWriters>,
}

/// One generation of the columns: the reader schema's (0), then one more for each widening.
#[derive(Debug)]
pub(crate) struct Columns {
    /// Its number.
    pub(crate) number: usize,
    /// The columns as declared JSON fields.
    fields: Vec<JsonField>,
    /// The decoding of them.
    pub(crate) decoding: JsonDecoding,
}

impl JsonSchemaDecoding {
    /// The decoding of Confluent-framed JSON values whose schemas are in `registry`, decoded into the columns of
    /// `reader` (a JSON Schema whose root is an object); keys no column declares mean what `unknown_fields` says.
    /// With `evolution` `add-columns`, a writer schema's new top-level properties become nullable columns instead
    /// of being refused; with `evolve`, also its properties added inside objects, and its optional properties the
    /// reader requires make their columns nullable. A job reading with it must follow
    /// [`KafkaSource::schema_change`](crate::KafkaSource::schema_change). Must be called inside a tokio runtime: the
    /// consumer thread looks up new schema ids through it.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the reader schema is not JSON, has no columns (its root is not an
    /// object with properties), or refers to other documents.
    pub fn from_registry(
        registry: SchemaRegistry,
        reader: ReaderSchema,
        unknown_fields: UnknownFields,
        evolution: Evolution,
    ) -> Result<Self> {
        let refuse = |why: String| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("JSON Schema {}: {why}", reader.named()),
            )
        };
        let doc: Doc = serde_json::from_str(&reader.schema)
            .map_err(|e| refuse(format!("is not JSON ({e})")))?;
        let fields = columns::columns(&doc).map_err(|why| refuse(format!("its {why}")))?;
        let decoding = JsonDecoding::declared(&fields, unknown_fields)
            .map_err(|e| e.context(format!("the columns of JSON Schema {}", reader.named())))?;
        Ok(Self {
            writers: Arc::new(JsonWriters {
                lookup: RegistryLookup::new(registry)?,
                reader,
                unknown_fields,
                evolution,
                generations: Mutex::new(vec![Arc::new(Columns {
                    number: 0,
                    fields,
                    decoding,
                })]),
                generation: AtomicUsize::new(0),
                validators: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The Arrow schema of the decoded rows (of the current generation of the columns).
    pub fn schema(&self) -> SchemaRef {
        self.columns().decoding.schema()
    }

    /// The reader schema the columns come from.
    pub fn reader_schema(&self) -> &ReaderSchema {
        &self.writers.reader
    }

    /// The current generation of the columns.
    pub(crate) fn columns(&self) -> Arc<Columns> {
        self.writers.current()
    }

    /// Looks up the schema of a Confluent-framed `value`, if it is new.
    ///
    /// # Errors
    /// As [`JsonWriters::resolve`].
    pub(crate) fn learn_schema(&self, at: RecordAt<'_>, value: &[u8]) -> Result<()> {
        match confluent_id(value) {
            Some(id) if !self.writers.lookup.accepted_last(id) => {
                self.writers.resolve(id, at)?;
                self.writers.lookup.note_accepted(id);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The number of the current generation of the columns, read without a lock (asked for every record).
    pub(crate) fn generation(&self) -> usize {
        self.writers.generation.load(Ordering::Acquire)
    }

    /// The JSON document of `value` (the record at `at`), validated against the schema its framing names.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record: not framed, a refused schema id, not JSON, or a
    /// violation of the schema; a registry that cannot be reached as for [`JsonWriters::resolve`].
    /// The validation is skipped where the writer's schema says nothing the strict decoding of the columns
    /// (`generation`, the one the rows read with) does not enforce ([`implied`]): the decoding then refuses every
    /// record the schema refuses.
    /// `last` is the caller's last schema id and what it was accepted as: records mostly carry the id of the one
    /// before, which is then not looked up again (the shared map takes a lock).
    pub(crate) fn document<'v>(
        &self,
        at: RecordAt<'_>,
        value: &'v [u8],
        generation: usize,
        last: &mut LastWriter,
    ) -> Result<Document<'v>> {
        let id = confluent_id(value).ok_or_else(|| {
            bad_record(
                at,
                "is not in the schema registry's wire format (0x00, a 4-byte schema id, the JSON document), \
                 which kind = \"json-schema\" reads",
            )
        })?;
        if !matches!(last, Some((known, _)) if *known == id) {
            *last = Some((id, self.writers.resolve(id, at)?));
        }
        let accepted = &last.as_ref().expect("set above").1;
        let body = &value[5..];
        let checked = |bounds| Document { body, id, bounds };
        if let Some(implied) = accepted
            .implied
            .as_ref()
            .filter(|i| i.generation == generation)
        {
            return Ok(checked(
                Some(implied.bounds.clone()).filter(|b| !b.is_empty()),
            ));
        }
        let validator = &accepted.validator;
        let parsed: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| bad_record(at, &format!("is not a JSON document ({e})")))?;
        // The quick check first: the violations are only gathered (and allocated) for a record that has some.
        if validator.is_valid(&parsed) {
            return Ok(checked(None));
        }
        let violations: Vec<String> = validator
            .iter_errors(&parsed)
            .take(VIOLATIONS_NAMED + 1)
            .map(|e| {
                let path = e.instance_path().to_string();
                format!("at `{}`: {e}", if path.is_empty() { "/" } else { &path })
            })
            .collect();
        if violations.is_empty() {
            return Ok(checked(None));
        }
        let more = if violations.len() > VIOLATIONS_NAMED {
            ", and more"
        } else {
            ""
        };
        let named: Vec<&str> = violations
            .iter()
            .take(VIOLATIONS_NAMED)
            .map(String::as_str)
            .collect();
        Err(bad_record(
            at,
            &format!("violates JSON Schema id {id}: {}{more}", named.join("; ")),
        ))
    }
}

/// The last writer schema a reader of documents met: its id and what it was accepted as
/// ([`JsonSchemaDecoding::document`]).
pub(crate) type LastWriter = Option<(u32, Arc<Accepted>)>;

/// An accepted writer schema: its validator, and what makes it unneeded, if anything does ([`implied`]).
#[derive(Debug)]
pub(crate) struct Accepted {
    validator: jsonschema::Validator,
    implied: Option<Implied>,
}

/// A writer schema the strict decoding of one generation of the columns enforces, with bounds on top-level
/// columns checked on each decoded value.
#[derive(Debug)]
struct Implied {
    generation: usize,
    bounds: Arc<Vec<BoundColumn>>,
}

/// What is checked on a top-level column's decoded values ([`implied::PropertyCheck`]).
#[derive(Debug)]
pub(crate) struct BoundColumn {
    /// The column's position.
    pub(crate) index: usize,
    /// Its name (the JSON pointer of its violations).
    pub(crate) name: String,
    pub(crate) bounds: Bounds,
    /// The validator of the property's keywords only a validator checks, run on the value alone.
    validator: Option<jsonschema::Validator>,
}

/// The column types whose decoded values [`JsonRows::last`](crate::json_rows::JsonRows::last) reads back exactly
/// (a `float32` column holds the value rounded, a decimal or a timestamp is not read back): the only ones checked
/// on decoded values.
const CHECKED_KINDS: [&str; 9] = [
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "float64", "string",
];

impl BoundColumn {
    /// What `value` (the column's decoded value) violates, as the validator would say it.
    pub(crate) fn violation(&self, value: Read<'_>) -> Option<String> {
        if let Some(why) = self.bounds.violation(value) {
            return Some(why);
        }
        let validator = self.validator.as_ref()?;
        let value = match value {
            Read::Null => return None,
            Read::Integer(v) => serde_json::Value::from(v),
            Read::Float(v) => serde_json::Value::from(serde_json::Number::from_f64(v)?),
            Read::Text(v) => serde_json::Value::from(v),
        };
        // The quick check first: the error is only made (and allocated) for a value that has one.
        if validator.is_valid(&value) {
            return None;
        }
        validator
            .iter_errors(&value)
            .next()
            .map(|error| error.to_string())
    }
}

/// A document ready to decode ([`JsonSchemaDecoding::document`]): its body, its writer schema's id, and the bounds to
/// check on its decoded values (empty: none, or the validator already judged it).
#[derive(Debug)]
pub(crate) struct Document<'v> {
    pub(crate) body: &'v [u8],
    pub(crate) id: u32,
    pub(crate) bounds: Option<Arc<Vec<BoundColumn>>>,
}

/// Writer schemas by id, each compiled into a validator once, shared by every decoder of one decoding.
pub(crate) struct JsonWriters {
    lookup: RegistryLookup,
    reader: ReaderSchema,
    unknown_fields: UnknownFields,
    /// How far the columns follow a writer: its new top-level properties (`add-columns`), also nested and
    /// optional ones (`evolve`).
    evolution: Evolution,
    generations: Mutex<Vec<Arc<Columns>>>,
    /// The last generation's number, set under the generations' lock after it is pushed.
    generation: AtomicUsize,
    validators: Mutex<HashMap<u32, Arc<Accepted>>>,
}

impl std::fmt::Debug for JsonWriters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonWriters")
            .field("lookup", &self.lookup)
            .field("reader", &self.reader.named())
            .finish_non_exhaustive()
    }
}

impl JsonWriters {
    fn generations(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Columns>>> {
        self.generations.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current generation of the columns.
    fn current(&self) -> Arc<Columns> {
        self.generations()
            .last()
            .expect("generation 0 always exists")
            .clone()
    }

    fn known(&self, id: u32) -> Option<Arc<Accepted>> {
        self.validators
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// The validator of schema `id`, which the record at `at` carries: looked up and accepted once.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record when the registry has no such id or it is refused
    /// (not a JSON Schema, references to other subjects, a schema that does not compile, properties the reader
    /// lacks); [`Retryable`](ErrorKind::Retryable) when the registry cannot be reached.
    pub(crate) fn resolve(&self, id: u32, at: RecordAt<'_>) -> Result<Arc<Accepted>> {
        if let Some(validator) = self.known(id) {
            return Ok(validator);
        }
        if let Some(refusal) = self.lookup.refusal(id, at) {
            return Err(refusal);
        }
        let writer = self.lookup.fetch(id, at)?;
        // Accepted under the generations' lock: two subtasks meeting the same new id widen the columns once.
        let mut generations = self.generations();
        if let Some(validator) = self.known(id) {
            return Ok(validator); // another thread accepted it meanwhile
        }
        let validator = self
            .accept(&mut generations, &writer)
            .map_err(|why| self.lookup.refuse(id, at, why))?;
        tracing::info!(id, reader = %self.reader.named(), "schema registry: new JSON Schema accepted");
        let mut validators = self.validators.lock().unwrap_or_else(|p| p.into_inner());
        Ok(validators.entry(id).or_insert(validator).clone())
    }

    /// The validator of `writer` when it may be read as the reader's columns; why not, as the end of a sentence
    /// about a record.
    fn accept(
        &self,
        generations: &mut Vec<Arc<Columns>>,
        writer: &RegisteredSchema,
    ) -> std::result::Result<Arc<Accepted>, String> {
        let id = writer.id;
        self_contained(
            writer,
            SchemaType::Json,
            "kind = \"json-schema\" reads JSON Schema",
            "its definitions",
        )?;
        let not_json = |e: serde_json::Error| {
            format!("is written with schema id {id}, which is not JSON ({e})")
        };
        let json: serde_json::Value = serde_json::from_str(&writer.schema).map_err(not_json)?;
        let doc: Doc = serde_json::from_str(&writer.schema).map_err(not_json)?;
        let fields = columns::columns(&doc)
            .map_err(|why| format!("is written with schema id {id}, whose {why}"))?;
        let current = generations.last().expect("generation 0 always exists");
        let mut added = Vec::new();
        added_fields(&fields, &current.fields, "", &mut added);
        let widened = self.widened(current, &fields, &added).map_err(|how| {
            let named: Vec<String> = added.iter().map(|f| format!("`{f}`")).collect();
            format!(
                "is written with schema id {id}, which has propert{} {} that {} lacks; the job stops rather than \
                 drop {} ({how})",
                if added.len() == 1 { "y" } else { "ies" },
                named.join(", "),
                self.reader.named(),
                if added.len() == 1 { "its values" } else { "their values" },
            )
        })?;
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(&json)
            .map_err(|e| {
                format!("is written with schema id {id}, which is not a valid JSON Schema: {e}")
            })?;
        if let Some(columns) = widened {
            tracing::info!(id, fields = ?added, generation = columns.number,
                "schema registry: JSON Schema columns widened with a writer's new properties");
            let number = columns.number;
            generations.push(Arc::new(columns));
            self.generation.store(number, Ordering::Release);
        }
        let current = generations.last().expect("generation 0 always exists");
        // Judged written out: a schema that only names its pieces in definitions says no more than without them.
        let written_out = inline::inlined(&doc);
        let implied = implied::implied(
            written_out.as_ref().unwrap_or(&doc),
            &fields,
            &current.fields,
            self.unknown_fields,
        )
        .and_then(|checks| {
            let columns = checks
                .into_iter()
                .map(|check| {
                    let index = current.fields.iter().position(|f| f.name == check.name)?;
                    if !CHECKED_KINDS.contains(&current.fields[index].kind.as_str()) {
                        return None;
                    }
                    let validator = match &check.validated {
                        None => None,
                        Some(keywords) => Some(jsonschema::validator_for(keywords).ok()?),
                    };
                    Some(BoundColumn {
                        index,
                        name: check.name,
                        bounds: check.bounds,
                        validator,
                    })
                })
                .collect::<Option<Vec<_>>>()?;
            Some(Implied {
                generation: current.number,
                bounds: Arc::new(columns),
            })
        });
        if let Some(implied) = &implied {
            tracing::info!(
                id,
                generation = current.number,
                bounds = implied.bounds.len(),
                "schema registry: the JSON Schema says nothing the strict decoding does not enforce (but for bounds \
                 checked on the decoded values); records are checked by decoding them"
            );
        }
        Ok(Arc::new(Accepted { validator, implied }))
    }

    /// The next generation of the columns taking `writer`'s properties, when it has any `current` lacks (`added`,
    /// their paths) or, with `evolve`, makes a required property optional, and the decoding may evolve that far;
    /// what to do instead, when not. New top-level properties need `add-columns`; nested ones and optional ones
    /// `evolve`.
    fn widened(
        &self,
        current: &Columns,
        writer: &[JsonField],
        added: &[String],
    ) -> std::result::Result<Option<Columns>, String> {
        let presence = self.evolution.changes_columns();
        let mut changes = Vec::new();
        let fields = evolved_fields(&current.fields, writer, "", presence, &mut changes);
        // A property the reader lacks inside one whose type differs (an object where the reader has a string)
        // cannot be a column: refused up front, as its values would be.
        if added.iter().any(|path| !changes.contains(path)) {
            return Err(
                "they lie inside a property whose type differs from the reader's, so they cannot be columns"
                    .into(),
            );
        }
        if changes.is_empty() {
            return Ok(None);
        }
        let nested: Vec<&String> = added.iter().filter(|f| f.contains(['.', '['])).collect();
        if !added.is_empty() && !self.evolution.adds_columns() {
            return Err(
                "with evolution = \"add-columns\" on every sink they would become columns".into(),
            );
        }
        if !nested.is_empty() && !self.evolution.changes_columns() {
            return Err(
                "with evolution = \"evolve\" on every sink the nested columns would take them"
                    .into(),
            );
        }
        let decoding = JsonDecoding::declared(&fields, self.unknown_fields)
            .map_err(|e| format!("they cannot be columns: {e}"))?;
        tracing::info!(changes = ?changes, generation = current.number + 1,
            "schema registry: JSON Schema columns widened for a writer's properties");
        Ok(Some(Columns {
            number: current.number + 1,
            fields,
            decoding,
        }))
    }
}

/// The reader's fields `reader` changed to take `writer`'s: the properties it lacks appended (nullable), at the
/// top level or inside objects (through list items and map values); with `presence`, a field the writer makes
/// optional made nullable. Every change's dotted path is listed in `changes`. A property whose type differs keeps
/// the reader's (its values are decoded strictly, record by record).
fn evolved_fields(
    reader: &[JsonField],
    writer: &[JsonField],
    prefix: &str,
    presence: bool,
    changes: &mut Vec<String>,
) -> Vec<JsonField> {
    let mut fields: Vec<JsonField> = reader
        .iter()
        .map(|r| {
            let path = format!("{prefix}{}", r.name);
            let Some(w) = writer.iter().find(|w| w.name == r.name) else {
                return r.clone();
            };
            let item = evolved_item(&item_of(r), &item_of(w), &path, presence, changes);
            JsonField {
                name: r.name.clone(),
                kind: item.kind,
                nullable: item.nullable,
                fields: item.fields,
                items: item.items,
                values: item.values,
            }
        })
        .collect();
    for w in writer {
        if reader.iter().all(|r| r.name != w.name) {
            changes.push(format!("{prefix}{}", w.name));
            fields.push(JsonField {
                nullable: true,
                ..w.clone()
            });
        }
    }
    fields
}

/// A reader's item (a field's type, a list's items, a map's values) changed to take the writer's (see
/// [`evolved_fields`]).
fn evolved_item(
    reader: &JsonItem,
    writer: &JsonItem,
    path: &str,
    presence: bool,
    changes: &mut Vec<String>,
) -> JsonItem {
    let mut item = reader.clone();
    if reader.kind != writer.kind {
        return item;
    }
    if presence && writer.nullable && !reader.nullable {
        changes.push(path.to_string());
        item.nullable = true;
    }
    item.fields = evolved_fields(
        &reader.fields,
        &writer.fields,
        &format!("{path}."),
        presence,
        changes,
    );
    if let (Some(r), Some(w)) = (&reader.items, &writer.items) {
        item.items = Some(Box::new(evolved_item(
            r,
            w,
            &format!("{path}[]"),
            presence,
            changes,
        )));
    }
    if let (Some(r), Some(w)) = (&reader.values, &writer.values) {
        item.values = Some(Box::new(evolved_item(
            r,
            w,
            &format!("{path}.*"),
            presence,
            changes,
        )));
    }
    item
}

/// The dotted paths of `writer`'s fields that `reader` lacks (through structs, list items and map values).
fn added_fields(writer: &[JsonField], reader: &[JsonField], prefix: &str, out: &mut Vec<String>) {
    for field in writer {
        let path = format!("{prefix}{}", field.name);
        match reader.iter().find(|r| r.name == field.name) {
            None => out.push(path),
            Some(known) => added_in_item(&item_of(field), &item_of(known), &path, out),
        }
    }
}

fn item_of(field: &JsonField) -> JsonItem {
    JsonItem {
        kind: field.kind.clone(),
        nullable: field.nullable,
        fields: field.fields.clone(),
        items: field.items.clone(),
        values: field.values.clone(),
    }
}

fn added_in_item(writer: &JsonItem, reader: &JsonItem, path: &str, out: &mut Vec<String>) {
    added_fields(&writer.fields, &reader.fields, &format!("{path}."), out);
    if let (Some(w), Some(r)) = (&writer.items, &reader.items) {
        added_in_item(w, r, &format!("{path}[]"), out);
    }
    if let (Some(w), Some(r)) = (&writer.values, &reader.values) {
        added_in_item(w, r, &format!("{path}.*"), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_rows::Read;

    const SCHEMA: &str = r#"{"type": "object", "required": ["id"],
        "properties": {"id": {"type": "integer"}, "at": {"type": "string", "format": "date-time"}}}"#;

    fn registered(id: u32, schema: &str, schema_type: SchemaType) -> RegisteredSchema {
        RegisteredSchema {
            id,
            schema: schema.to_string(),
            schema_type,
            references: Vec::new(),
            version: None,
        }
    }

    /// The decoding of [`SCHEMA`] (id 7), evolving or not, over a registry that is never asked (its address
    /// answers nothing).
    fn decoding_of(evolution: Evolution) -> JsonSchemaDecoding {
        let settings: schema_registry::RegistrySettings =
            serde_json::from_value(serde_json::json!({"url": "http://127.0.0.1:9/"})).unwrap();
        let reader = ReaderSchema {
            schema: SCHEMA.to_string(),
            id: Some(7),
            origin: "the test schema".to_string(),
        };
        JsonSchemaDecoding::from_registry(
            SchemaRegistry::new(&settings).unwrap(),
            reader,
            UnknownFields::Fail,
            evolution,
        )
        .unwrap()
    }

    /// [`decoding_of`] without evolving, with writer 7 accepted as a registry lookup would.
    /// A decoding reading `schema` (id 8) strictly, not evolving, over a registry that is never asked.
    fn strict_decoding(schema: &str) -> JsonSchemaDecoding {
        JsonSchemaDecoding::from_registry(
            SchemaRegistry::new(&schema_registry::RegistrySettings::new(
                "http://127.0.0.1:9/",
            ))
            .unwrap(),
            ReaderSchema {
                schema: schema.to_string(),
                id: Some(8),
                origin: "the schema".to_string(),
            },
            UnknownFields::Fail,
            Evolution::None,
        )
        .unwrap()
    }

    fn decoding() -> JsonSchemaDecoding {
        let decoding = decoding_of(Evolution::None);
        let validator = decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(7, SCHEMA, SchemaType::Json),
            )
            .unwrap();
        decoding
            .writers
            .validators
            .lock()
            .unwrap()
            .insert(7, validator);
        decoding
    }

    fn framed(id: u32, body: &str) -> Vec<u8> {
        let mut value = vec![0];
        value.extend(id.to_be_bytes());
        value.extend(body.as_bytes());
        value
    }

    const AT: RecordAt<'static> = RecordAt {
        topic: "orders",
        partition: 1,
        offset: 5,
    };

    #[tokio::test]
    async fn each_value_is_unframed_and_validated_against_its_schema_id() {
        let decoding = decoding();
        let value = framed(7, r#"{"id": 1, "at": "2026-12-05T10:00:00Z"}"#);
        assert_eq!(
            decoding.document(AT, &value, 0, &mut None).unwrap().body,
            br#"{"id": 1, "at": "2026-12-05T10:00:00Z"}"#
        );
        let err = decoding
            .document(
                AT,
                &framed(7, r#"{"id": "one", "at": "yesterday"}"#),
                0,
                &mut None,
            )
            .unwrap_err();
        let text = err.to_string();
        assert_eq!(err.kind(), ErrorKind::BadRecord);
        for part in ["orders/1@5", "violates JSON Schema id 7", "`/id`", "`/at`"] {
            assert!(text.contains(part), "{part} in {text}");
        }
        let err = decoding
            .document(AT, br#"{"id": 1}"#, 0, &mut None)
            .unwrap_err();
        assert!(err.to_string().contains("wire format"), "{err}");
        let err = decoding
            .document(AT, &framed(7, "{"), 0, &mut None)
            .unwrap_err();
        assert!(err.to_string().contains("not a JSON document"), "{err}");
    }

    #[tokio::test]
    async fn an_evolving_decoding_takes_new_top_level_properties_as_nullable_columns() {
        let decoding = decoding_of(Evolution::AddColumns);
        let wider = r#"{"type": "object", "required": ["id", "qty"], "properties": {"id": {"type": "integer"},
            "at": {"type": "string", "format": "date-time"}, "qty": {"type": "integer"}}}"#;
        decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(9, wider, SchemaType::Json),
            )
            .unwrap();
        let columns = decoding.columns();
        assert_eq!(columns.number, 1);
        let qty = decoding.schema().field_with_name("qty").unwrap().clone();
        assert!(qty.is_nullable(), "{qty:?}");
        // A new object is a new (struct) column; a property added inside it later is refused, naming it.
        let with_customer = r#"{"type": "object", "properties": {"id": {"type": "integer"},
            "customer": {"type": "object", "properties": {"email": {"type": "string"}}}}}"#;
        decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(10, with_customer, SchemaType::Json),
            )
            .unwrap();
        assert_eq!(decoding.columns().number, 2);
        let nested = r#"{"type": "object", "properties": {"id": {"type": "integer"},
            "customer": {"type": "object", "properties": {"email": {"type": "string"}, "phone": {"type": "string"}}}}}"#;
        let why = decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(11, nested, SchemaType::Json),
            )
            .unwrap_err();
        assert!(
            why.contains("`customer.phone`") && why.contains("evolve"),
            "{why}"
        );
        assert_eq!(decoding.columns().number, 2);
    }

    #[tokio::test]
    async fn with_evolve_nested_and_optional_properties_widen_the_columns() {
        let decoding = decoding_of(Evolution::Evolve);
        let evolved = r#"{"type": "object", "properties": {"id": {"type": "integer"},
            "at": {"type": "string", "format": "date-time"},
            "customer": {"type": "object", "properties": {"email": {"type": "string"}}}}}"#;
        decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(9, evolved, SchemaType::Json),
            )
            .unwrap();
        let schema = decoding.schema();
        assert!(
            schema.field_with_name("id").unwrap().is_nullable(),
            "id made optional"
        );
        let nested = r#"{"type": "object", "properties": {"id": {"type": "integer"},
            "customer": {"type": "object", "properties": {"email": {"type": "string"}, "phone": {"type": "string"}}}}}"#;
        decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(10, nested, SchemaType::Json),
            )
            .unwrap();
        let schema = decoding.schema();
        let arrow_schema::DataType::Struct(customer) =
            schema.field_with_name("customer").unwrap().data_type()
        else {
            panic!("{schema:?}")
        };
        let names: Vec<&str> = customer.iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["email", "phone"]);
        assert!(customer[1].is_nullable());
        assert_eq!(decoding.columns().number, 2);
    }

    #[tokio::test]
    async fn writer_schemas_the_columns_cannot_read_are_refused_naming_why() {
        let decoding = decoding();
        let wider = r#"{"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"}}}"#;
        let why = decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(9, wider, SchemaType::Json),
            )
            .unwrap_err();
        assert!(
            why.contains("schema id 9")
                && why.contains("`note`")
                && why.contains("the test schema"),
            "{why}"
        );
        let why = decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(
                    10,
                    r#"{"type": "record", "name": "A", "fields": []}"#,
                    SchemaType::Avro,
                ),
            )
            .unwrap_err();
        assert!(why.contains("AVRO"), "{why}");
        let narrower = r#"{"type": "object", "properties": {"id": {"type": "integer"}}}"#;
        decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(11, narrower, SchemaType::Json),
            )
            .unwrap();
    }

    #[tokio::test]
    async fn a_schema_the_decoding_enforces_is_not_validated_twice() {
        let decoding = decoding();
        // SCHEMA has a `format`, which only the validator checks.
        assert!(decoding.writers.resolve(7, AT).unwrap().implied.is_none());
        let structural = r#"{"type": "object", "required": ["id"], "additionalProperties": false,
            "properties": {"id": {"type": "integer"}, "at": {"type": ["string", "null"]}}}"#;
        let accepted = decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(8, structural, SchemaType::Json),
            )
            .unwrap();
        assert!(
            accepted.implied.is_none(),
            "its columns are not the reader's (no date-time)"
        );
        let plain = strict_decoding(structural);
        let accepted = plain
            .writers
            .accept(
                &mut plain.writers.generations(),
                &registered(8, structural, SchemaType::Json),
            )
            .unwrap();
        assert_eq!(accepted.implied.as_ref().map(|i| i.generation), Some(0));
        assert!(accepted.implied.as_ref().unwrap().bounds.is_empty());
    }

    #[tokio::test]
    async fn top_level_bounds_are_checked_on_decoded_values_instead_of_validating() {
        let bounded = r#"{"type": "object", "required": ["id", "code"], "additionalProperties": false,
            "properties": {"id": {"type": "integer", "minimum": 0}, "code": {"type": "string", "maxLength": 2}}}"#;
        let decoding = strict_decoding(bounded);
        let accepted = decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(8, bounded, SchemaType::Json),
            )
            .unwrap();
        decoding
            .writers
            .validators
            .lock()
            .unwrap()
            .insert(8, accepted);
        // Not validated: the document comes back with the bounds to check once decoded.
        let value = framed(8, r#"{"id": -1, "code": "abc"}"#);
        let document = decoding.document(AT, &value, 0, &mut None).unwrap();
        let bounds = document.bounds.unwrap();
        let names: Vec<&str> = bounds.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["id", "code"]);
        assert!(bounds[0].bounds.violation(Read::Integer(-1)).is_some());
        assert!(bounds[1].bounds.violation(Read::Text("abc")).is_some());
        assert!(bounds[1].bounds.violation(Read::Text("ab")).is_none());
    }

    /// A top-level `pattern`, `enum`, `const` or fractional `multipleOf` is checked on the decoded value by a
    /// validator of that property alone, and judges as the whole document's validator does, document by document.
    #[tokio::test]
    async fn top_level_keywords_are_validated_on_the_decoded_value_alone_as_the_document_would_be()
    {
        let schema = r#"{"type": "object", "required": ["id", "kind"], "additionalProperties": false,
            "properties": {"id": {"type": "integer", "multipleOf": 2.5},
                           "kind": {"type": "string", "enum": ["a", "b"]},
                           "code": {"type": ["string", "null"], "pattern": "^[A-Z]{3}$"},
                           "ratio": {"type": ["number", "null"], "minimum": 0}}}"#;
        let decoding = strict_decoding(schema);
        let accepted = decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(8, schema, SchemaType::Json),
            )
            .unwrap();
        let checks = accepted.implied.as_ref().expect("not validated whole");
        let names: Vec<&str> = checks.bounds.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["id", "kind", "code", "ratio"]);
        let whole = jsonschema::validator_for(&serde_json::from_str(schema).unwrap()).unwrap();
        let documents = [
            r#"{"id": 5, "kind": "a"}"#,
            r#"{"id": 4, "kind": "a"}"#,
            r#"{"id": 0, "kind": "c"}"#,
            r#"{"id": -10, "kind": "b", "code": "ABC"}"#,
            r#"{"id": 10, "kind": "b", "code": "AB"}"#,
            r#"{"id": 10, "kind": "b", "code": null}"#,
            r#"{"id": 10, "kind": "b", "ratio": -0.5}"#,
            r#"{"id": 10, "kind": "b", "ratio": 0.5, "code": "XYZ"}"#,
        ];
        judged_as_the_validator_does(&decoding, checks, &whole, &documents);
        // A nullable property's `enum` would judge a null the decoding cannot tell from a missing key: the whole
        // document is validated.
        let nullable_enum = r#"{"type": "object", "properties": {"kind": {"type": ["string", "null"], "enum": ["a"]}}}"#;
        let plain = decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(9, nullable_enum, SchemaType::Json),
            )
            .unwrap();
        assert!(plain.implied.is_none());
    }

    /// Asserts that each of `documents` is refused by the strict decoding of `decoding`'s columns and `checks`
    /// exactly when `whole` (the writer schema's validator) refuses it.
    fn judged_as_the_validator_does(
        decoding: &JsonSchemaDecoding,
        checks: &Implied,
        whole: &jsonschema::Validator,
        documents: &[&str],
    ) {
        let schema = decoding.columns().decoding.schema();
        for document in documents {
            let mut rows = crate::json_rows::JsonRows::new(schema.fields(), UnknownFields::Fail, 1);
            let refused = match rows.append(document.as_bytes(), &mut Default::default()) {
                Err(why) => Some(why),
                Ok(()) => checks
                    .bounds
                    .iter()
                    .find_map(|column| column.violation(rows.last(column.index))),
            };
            let value: serde_json::Value = serde_json::from_str(document).unwrap();
            assert_eq!(
                refused.is_some(),
                !whole.is_valid(&value),
                "{document}: {refused:?}"
            );
        }
    }

    /// A schema that names its pieces in `definitions` and refers to them is judged written out: its records are
    /// checked by the decoding (and the bounds on decoded values), exactly as its validator would judge them.
    #[tokio::test]
    async fn local_references_are_judged_written_out_as_the_validator_would() {
        let schema = r##"{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "required": ["id", "customer"], "additionalProperties": false,
            "definitions": {"customer": {"type": "integer", "minimum": 0},
                            "line": {"type": "object", "required": ["sku"], "additionalProperties": false,
                                     "properties": {"sku": {"type": "string"}}}},
            "properties": {"id": {"type": "integer"}, "customer": {"$ref": "#/definitions/customer"},
                           "note": {"type": ["string", "null"]},
                           "line": {"anyOf": [{"type": "null"}, {"$ref": "#/definitions/line"}]}}}"##;
        let decoding = strict_decoding(schema);
        let accepted = decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(8, schema, SchemaType::Json),
            )
            .unwrap();
        let checks = accepted.implied.as_ref().expect("not validated whole");
        let names: Vec<&str> = checks.bounds.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["customer"]);
        let whole = jsonschema::validator_for(&serde_json::from_str(schema).unwrap()).unwrap();
        let documents = [
            r#"{"id": 1, "customer": 2}"#,
            r#"{"id": 1, "customer": 2, "note": "n", "line": {"sku": "a"}}"#,
            r#"{"id": 1, "customer": 2, "line": null}"#,
            r#"{"id": 1, "customer": -2}"#,
            r#"{"id": 1, "customer": 2.5}"#,
            r#"{"id": 1}"#,
            r#"{"id": 1, "customer": 2, "line": {"sku": 3}}"#,
            r#"{"id": 1, "customer": 2, "line": {"sku": "a", "qty": 1}}"#,
            r#"{"id": 1, "customer": 2, "line": {}}"#,
            r#"{"id": 1, "customer": 2, "line": []}"#,
            r#"{"id": 1, "customer": 2, "other": 1}"#,
        ];
        judged_as_the_validator_does(&decoding, checks, &whole, &documents);
    }

    fn fields(schema: &str) -> Vec<JsonField> {
        columns::columns(&serde_json::from_str(schema).unwrap()).unwrap()
    }

    #[test]
    fn a_writers_new_properties_are_found_at_any_depth() {
        let reader = fields(
            r#"{"type": "object", "properties": {"id": {"type": "integer"},
                "customer": {"type": "object", "properties": {"name": {"type": "string"}}},
                "lines": {"type": "array", "items": {"type": "object", "properties": {"qty": {"type": "integer"}}}}}}"#,
        );
        let writer = fields(
            r#"{"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"},
                "customer": {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}}},
                "lines": {"type": "array", "items": {"type": "object", "properties": {"qty": {"type": "integer"},
                                                                                       "sku": {"type": "string"}}}}}}"#,
        );
        let mut added = Vec::new();
        added_fields(&writer, &reader, "", &mut added);
        added.sort();
        assert_eq!(added, ["customer.email", "lines[].sku", "note"]);
        let mut none = Vec::new();
        added_fields(&reader, &writer, "", &mut none);
        assert!(none.is_empty(), "{none:?}");
    }
}
