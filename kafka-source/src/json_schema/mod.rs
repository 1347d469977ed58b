//! JSON Schema through the schema registry: each value is Confluent-framed (`0x00`, the 4-byte big-endian schema id,
//! the JSON document, as confluent-kafka's `JSONSerializer` writes it). The reader schema (the subject's latest
//! version) gives the columns ([`columns`]: its root object's properties, decoded exactly as declared JSON fields
//! are); every record is validated against the schema its id names before it is decoded.
//!
//! A record is a [`BadRecord`](ErrorKind::BadRecord) (dead-lettered when the job has a dead-letter topic) when it
//! is not framed, its id is not a JSON Schema the registry has, it is not JSON, it violates its schema (the error
//! names the JSON pointer of each violation, up to three), or a value does not fit its column exactly. A writer
//! schema with properties the reader lacks is refused, naming them and both ids (their values would otherwise be
//! dropped), unless the decoding evolves (every sink has `evolution = "add-columns"`) and they are top-level: then
//! they become nullable columns, in a new *generation* of the columns whose batches the source hands out as a
//! schema change ([`KafkaSource::schema_change`](crate::KafkaSource::schema_change)). New nested properties are
//! refused either way (planned).

mod columns;
mod doc;
mod implied;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow_schema::SchemaRef;
use connector_api::{Error, ErrorKind, Phase, Result};
use schema_registry::{RegisteredSchema, SchemaRegistry, SchemaType};

use crate::json_rows::UnknownFields;
use crate::json_types::{JsonDecoding, JsonField, JsonItem};
use crate::record::{RecordAt, bad_record};
use crate::registry_lookup::{RegistryLookup, confluent_id, self_contained};
use crate::writer_schemas::ReaderSchema;
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
    /// With `evolve`, a writer schema's new top-level properties become nullable columns instead of being refused:
    /// a job reading with it must follow [`KafkaSource::schema_change`](crate::KafkaSource::schema_change). Must be
    /// called inside a tokio runtime: the consumer thread looks up new schema ids through it.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the reader schema is not JSON, has no columns (its root is not an
    /// object with properties), or refers to other documents.
    pub fn from_registry(
        registry: SchemaRegistry,
        reader: ReaderSchema,
        unknown_fields: UnknownFields,
        evolve: bool,
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
                evolve,
                generations: Mutex::new(vec![Arc::new(Columns {
                    number: 0,
                    fields,
                    decoding,
                })]),
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
            Some(id) => self.writers.resolve(id, at).map(drop),
            None => Ok(()),
        }
    }

    /// The JSON document of `value` (the record at `at`), validated against the schema its framing names.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record: not framed, a refused schema id, not JSON, or a
    /// violation of the schema; a registry that cannot be reached as for [`JsonWriters::resolve`].
    /// The validation is skipped where the writer's schema says nothing the strict decoding of the columns
    /// (`generation`, the one the rows read with) does not enforce ([`implied`]): the decoding then refuses every
    /// record the schema refuses.
    pub(crate) fn document<'v>(
        &self,
        at: RecordAt<'_>,
        value: &'v [u8],
        generation: usize,
    ) -> Result<&'v [u8]> {
        let id = confluent_id(value).ok_or_else(|| {
            bad_record(
                at,
                "is not in the schema registry's wire format (0x00, a 4-byte schema id, the JSON document), \
                 which kind = \"json-schema\" reads",
            )
        })?;
        let accepted = self.writers.resolve(id, at)?;
        let body = &value[5..];
        if accepted.implied_in == Some(generation) {
            return Ok(body);
        }
        let validator = &accepted.validator;
        let parsed: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| bad_record(at, &format!("is not a JSON document ({e})")))?;
        // The quick check first: the violations are only gathered (and allocated) for a record that has some.
        if validator.is_valid(&parsed) {
            return Ok(body);
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
            return Ok(body);
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

/// An accepted writer schema: its validator, and the generation of the columns whose strict decoding enforces all
/// it says, if one does ([`implied`]).
#[derive(Debug)]
pub(crate) struct Accepted {
    validator: jsonschema::Validator,
    implied_in: Option<usize>,
}

/// Writer schemas by id, each compiled into a validator once, shared by every decoder of one decoding.
pub(crate) struct JsonWriters {
    lookup: RegistryLookup,
    reader: ReaderSchema,
    unknown_fields: UnknownFields,
    /// Widen the columns with a writer's new top-level properties instead of refusing them.
    evolve: bool,
    generations: Mutex<Vec<Arc<Columns>>>,
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
            generations.push(Arc::new(columns));
        }
        let current = generations.last().expect("generation 0 always exists");
        let implied_in = implied::implied(&doc, &fields, &current.fields, self.unknown_fields)
            .then_some(current.number);
        if implied_in.is_some() {
            tracing::info!(
                id,
                generation = current.number,
                "schema registry: the JSON Schema says nothing the strict decoding does not enforce; records are \
                 checked by decoding them"
            );
        }
        Ok(Arc::new(Accepted {
            validator,
            implied_in,
        }))
    }

    /// The next generation of the columns with `added` (paths of `writer`'s properties `current` lacks) as
    /// nullable columns, when there are any and the decoding may evolve; what to do instead, when not.
    fn widened(
        &self,
        current: &Columns,
        writer: &[JsonField],
        added: &[String],
    ) -> std::result::Result<Option<Columns>, String> {
        const NESTED: &str = "new nested properties are not taken yet (planned): restart the job to read with \
                              the subject's latest schema";
        if added.is_empty() {
            return Ok(None);
        }
        if added.iter().any(|f| f.contains(['.', '['])) {
            return Err(NESTED.into());
        }
        if !self.evolve {
            return Err(
                "with evolution = \"add-columns\" on every sink they would become columns".into(),
            );
        }
        let mut fields = current.fields.clone();
        fields.extend(
            writer
                .iter()
                .filter(|f| added.contains(&f.name))
                .map(|f| JsonField {
                    nullable: true,
                    ..f.clone()
                }),
        );
        let decoding = JsonDecoding::declared(&fields, self.unknown_fields)
            .map_err(|e| format!("they cannot be columns: {e}"))?;
        Ok(Some(Columns {
            number: current.number + 1,
            fields,
            decoding,
        }))
    }
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
    fn decoding_of(evolve: bool) -> JsonSchemaDecoding {
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
            evolve,
        )
        .unwrap()
    }

    /// [`decoding_of`] without evolving, with writer 7 accepted as a registry lookup would.
    fn decoding() -> JsonSchemaDecoding {
        let decoding = decoding_of(false);
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
            decoding.document(AT, &value, 0).unwrap(),
            br#"{"id": 1, "at": "2026-12-05T10:00:00Z"}"#
        );
        let err = decoding
            .document(AT, &framed(7, r#"{"id": "one", "at": "yesterday"}"#), 0)
            .unwrap_err();
        let text = err.to_string();
        assert_eq!(err.kind(), ErrorKind::BadRecord);
        for part in ["orders/1@5", "violates JSON Schema id 7", "`/id`", "`/at`"] {
            assert!(text.contains(part), "{part} in {text}");
        }
        let err = decoding.document(AT, br#"{"id": 1}"#, 0).unwrap_err();
        assert!(err.to_string().contains("wire format"), "{err}");
        let err = decoding.document(AT, &framed(7, "{"), 0).unwrap_err();
        assert!(err.to_string().contains("not a JSON document"), "{err}");
    }

    #[tokio::test]
    async fn an_evolving_decoding_takes_new_top_level_properties_as_nullable_columns() {
        let decoding = decoding_of(true);
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
            why.contains("`customer.phone`") && why.contains("planned"),
            "{why}"
        );
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
        assert_eq!(decoding.writers.resolve(7, AT).unwrap().implied_in, None);
        let structural = r#"{"type": "object", "required": ["id"], "additionalProperties": false,
            "properties": {"id": {"type": "integer"}, "at": {"type": ["string", "null"]}}}"#;
        let accepted = decoding
            .writers
            .accept(
                &mut decoding.writers.generations(),
                &registered(8, structural, SchemaType::Json),
            )
            .unwrap();
        assert_eq!(
            accepted.implied_in, None,
            "its columns are not the reader's (no date-time)"
        );
        let plain = JsonSchemaDecoding::from_registry(
            SchemaRegistry::new(&schema_registry::RegistrySettings::new(
                "http://127.0.0.1:9/",
            ))
            .unwrap(),
            ReaderSchema {
                schema: structural.to_string(),
                id: Some(8),
                origin: "the structural schema".to_string(),
            },
            UnknownFields::Fail,
            false,
        )
        .unwrap();
        let accepted = plain
            .writers
            .accept(
                &mut plain.writers.generations(),
                &registered(8, structural, SchemaType::Json),
            )
            .unwrap();
        assert_eq!(accepted.implied_in, Some(0));
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
