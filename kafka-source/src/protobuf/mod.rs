//! Protobuf through the schema registry: each value is Confluent-framed (`0x00`, the 4-byte big-endian schema id,
//! the message-index path, the message), as confluent-kafka's `ProtobufSerializer` and Confluent's Java
//! serializer write it. The reader schema (the subject's latest version) and its message (`record_name`, or the
//! file's first message) give the columns ([`columns`]); every record is decoded with the schema its id names
//! (compiled once per id, its references resolved through the registry, [`schema_registry::protobuf`]) and its fields read into
//! the columns by field number, converted exactly ([`rows`]).
//!
//! A record is a [`BadRecord`](ErrorKind::BadRecord) (dead-lettered when the job has a dead-letter topic) when it
//! is not framed, its id is not a Protobuf schema the registry has, its message-index path names no message or a
//! message other than the reader's, its body is not that message, or a value does not fit its column exactly (a
//! timestamp with nanoseconds, an enum number the reader does not declare). A writer whose fields the reader
//! lacks is refused naming them and both ids, unless the decoding evolves: with every sink's `evolution =
//! "add-columns"` new top-level fields become nullable columns, and with `"evolve"` also fields added inside
//! message columns, scalars the writer widens and fields it gives presence, in a new *generation* of the columns
//! handed out as a schema change ([`KafkaSource::schema_change`](crate::KafkaSource::schema_change)).

mod columns;
mod message_path;
mod rows;
mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Schema, SchemaRef};
use connector_api::{Error, ErrorKind, Evolution, Phase, Result};
use prost_reflect::{DynamicMessage, FileDescriptor, MessageDescriptor};
use schema_registry::{RegisteredSchema, SchemaRegistry, SchemaType};

use crate::record::{RecordAt, bad_record};
use crate::registry_lookup::{RegistryLookup, confluent_id};
use crate::writer_schemas::ReaderSchema;
use columns::{Change, ProtoColumn, arrow_fields};
use rows::MessageRows;
use schema_registry::protobuf::{ProtobufSchemaError, compile};
use wire::{FlatError, FlatPlan};

/// The Protobuf decoding: the reader message's columns (widened as writers add fields, when it evolves), and the
/// writer messages by schema id and message-index path.
#[derive(Debug, Clone)]
pub struct ProtobufDecoding {
    writers: Arc<ProtoWriters>,
}

/// One generation of the columns: the reader message's (0), then one more for each widening.
#[derive(Debug)]
pub(crate) struct Columns {
    /// Its number.
    pub(crate) number: usize,
    columns: Vec<ProtoColumn>,
    schema: SchemaRef,
}

impl ProtobufDecoding {
    /// The decoding of Confluent-framed Protobuf values whose schemas are in `registry`, decoded into the columns
    /// of message `message` (a full name; `None`: the first message) of `file`, the compiled `reader` schema.
    /// With `evolution` `add-columns`, a writer's new top-level fields become nullable columns instead of being
    /// refused; with `evolve`, also its fields added inside message columns, its scalars wider than the reader's
    /// (`int32` to `int64`, `float` to `double`) and its fields with presence where the
    /// reader's have none (nullable columns). A job reading with it must follow
    /// [`KafkaSource::schema_change`](crate::KafkaSource::schema_change). Must be called inside a tokio runtime:
    /// the consumer thread looks up new schema ids through it.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the file has no such message (naming the ones it has) or a field of it
    /// has no column type (naming the field).
    pub fn from_registry(
        registry: SchemaRegistry,
        reader: ReaderSchema,
        file: &FileDescriptor,
        message: Option<&str>,
        evolution: Evolution,
    ) -> Result<Self> {
        let refuse = |why: String| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("Protobuf schema {}: {why}", reader.named()),
            )
        };
        let descriptor = match message {
            Some(name) => file.messages().find(|m| m.full_name() == name),
            None => file.messages().next(),
        }
        .ok_or_else(|| {
            let names: Vec<String> = file.messages().map(|m| m.full_name().to_string()).collect();
            refuse(format!(
                "has no message {} (its top-level messages: {}); set record_name to one of them",
                message.unwrap_or("at all"),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ))
        })?;
        let columns = columns::columns(&descriptor)
            .map_err(|why| refuse(format!("message {}: {why}", descriptor.full_name())))?;
        Ok(Self {
            writers: Arc::new(ProtoWriters {
                lookup: RegistryLookup::new(registry)?,
                reader,
                message: descriptor.full_name().to_string(),
                evolution,
                generations: Mutex::new(vec![Arc::new(Columns::new(0, columns))]),
                generation: AtomicUsize::new(0),
                files: Mutex::new(HashMap::new()),
                messages: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The same decoding with the columns (and struct fields) of the paths of field numbers in `names` named as
    /// it says: a renamed field keeps the column its number had ([`crate::renames`]). Before any record is decoded.
    pub(crate) fn keeping_column_names(
        self,
        names: &std::collections::BTreeMap<Vec<u32>, String>,
    ) -> Self {
        if names.is_empty() {
            return self;
        }
        {
            let mut generations = self
                .writers
                .generations
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let mut columns = generations[0].columns.clone();
            columns::rename(&mut columns, names, &mut Vec::new());
            generations[0] = Arc::new(Columns::new(0, columns));
        }
        self
    }

    /// The Arrow schema of the decoded rows (of the current generation of the columns).
    pub fn schema(&self) -> SchemaRef {
        self.columns().schema.clone()
    }

    /// The reader schema the columns come from.
    pub fn reader_schema(&self) -> &ReaderSchema {
        &self.writers.reader
    }

    /// The full name of the message the columns come from.
    pub fn message(&self) -> &str {
        &self.writers.message
    }

    /// The current generation of the columns.
    pub(crate) fn columns(&self) -> Arc<Columns> {
        self.writers.current()
    }

    /// Looks up the schema of a Confluent-framed `value`, if it is new.
    ///
    /// # Errors
    /// As [`ProtoWriters::resolve`].
    pub(crate) fn learn_schema(&self, at: RecordAt<'_>, value: &[u8]) -> Result<()> {
        match framing(at, value) {
            // The first message of the schema (the usual one) of the id accepted last: known without a lock.
            Ok((id, path, _)) if path.is_empty() && self.writers.lookup.accepted_last(id) => Ok(()),
            Ok((id, path, _)) => {
                self.writers.resolve(id, &path, at)?;
                if path.is_empty() {
                    self.writers.lookup.note_accepted(id);
                }
                Ok(())
            }
            Err(_) => Ok(()),
        }
    }
}

/// The refusal of the record at `at` whose body is not a valid `descriptor` message of schema `id`.
fn not_the_message(at: RecordAt<'_>, id: u32, descriptor: &MessageDescriptor, why: &str) -> Error {
    bad_record(
        at,
        &format!(
            "is not a {} message of schema id {id} ({why})",
            descriptor.full_name()
        ),
    )
}

/// The schema id, the message-index path (empty for `[0]`) and the body of a Confluent-framed Protobuf `value`.
fn framing<'v>(at: RecordAt<'_>, value: &'v [u8]) -> Result<(u32, Vec<usize>, &'v [u8])> {
    let id = confluent_id(value).ok_or_else(|| {
        bad_record(
            at,
            "is not in the schema registry's wire format (0x00, a 4-byte schema id, the message-index path, the \
             message), which kind = \"protobuf\" reads",
        )
    })?;
    let (mut path, body) =
        message_path::message_indexes(&value[5..]).map_err(|why| bad_record(at, &why))?;
    if path == [0] {
        path.clear();
    }
    Ok((id, path, body))
}

impl Columns {
    fn new(number: usize, columns: Vec<ProtoColumn>) -> Self {
        Self {
            number,
            schema: Arc::new(Schema::new(arrow_fields(&columns))),
            columns,
        }
    }
}

/// Writer schemas by id, each compiled once, and the messages accepted by (id, path), shared by every decoder of
/// one decoding.
pub(crate) struct ProtoWriters {
    lookup: RegistryLookup,
    reader: ReaderSchema,
    /// The full name of the reader's message.
    message: String,
    /// How far the columns follow a writer: its new top-level fields (`add-columns`), also nested fields, wider
    /// scalars and presence (`evolve`).
    evolution: Evolution,
    generations: Mutex<Vec<Arc<Columns>>>,
    /// The last generation's number, set under the generations' lock after it is pushed.
    generation: AtomicUsize,
    files: Mutex<HashMap<u32, FileDescriptor>>,
    messages: Mutex<HashMap<(u32, Vec<usize>), MessageDescriptor>>,
}

impl std::fmt::Debug for ProtoWriters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtoWriters")
            .field("lookup", &self.lookup)
            .field("reader", &self.reader.named())
            .field("message", &self.message)
            .finish_non_exhaustive()
    }
}

impl ProtoWriters {
    fn generations(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Columns>>> {
        self.generations.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn current(&self) -> Arc<Columns> {
        self.generations()
            .last()
            .expect("generation 0 always exists")
            .clone()
    }

    fn known(&self, id: u32, path: &[usize]) -> Option<MessageDescriptor> {
        self.messages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(id, path.to_vec()))
            .cloned()
    }

    /// The message schema `id` and message-index `path` (empty for `[0]`) name, which the record at `at` carries:
    /// compiled and accepted once.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record when the registry has no such id or it is refused
    /// (not Protobuf, does not compile, the path names no message or another message than the reader's, fields
    /// the reader lacks or reads as another type); [`Retryable`](ErrorKind::Retryable) when the registry cannot
    /// be reached.
    pub(crate) fn resolve(
        &self,
        id: u32,
        path: &[usize],
        at: RecordAt<'_>,
    ) -> Result<MessageDescriptor> {
        if let Some(message) = self.known(id, path) {
            return Ok(message);
        }
        if let Some(refusal) = self.lookup.refusal(id, at) {
            return Err(refusal);
        }
        let file = self.file(id, at)?;
        // Accepted under the generations' lock: two subtasks meeting the same new writer widen the columns once.
        let mut generations = self.generations();
        if let Some(message) = self.known(id, path) {
            return Ok(message);
        }
        let message = self
            .accept(&mut generations, id, &file, path)
            .map_err(|why| self.lookup.refuse(id, at, why))?;
        tracing::info!(id, message = message.full_name(), reader = %self.reader.named(),
            "schema registry: new Protobuf writer schema accepted");
        let mut messages = self.messages.lock().unwrap_or_else(|p| p.into_inner());
        Ok(messages
            .entry((id, path.to_vec()))
            .or_insert(message)
            .clone())
    }

    /// Schema `id` compiled, with its references fetched from the registry.
    fn file(&self, id: u32, at: RecordAt<'_>) -> Result<FileDescriptor> {
        if let Some(file) = self
            .files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
        {
            return Ok(file.clone());
        }
        let writer = self.lookup.fetch(id, at)?;
        if writer.schema_type != SchemaType::Protobuf {
            return Err(self.lookup.refuse(
                id,
                at,
                format!(
                    "is written with schema id {id}, a {} schema; kind = \"protobuf\" reads Protobuf",
                    writer.schema_type
                ),
            ));
        }
        let file = match self
            .lookup
            .block_on(|registry| compile_owned(registry, writer))
        {
            Ok(file) => file,
            Err(ProtobufSchemaError::Registry { subject, source }) if !source.is_not_found() => {
                return Err(Error::new(
                    source.kind(),
                    Phase::Write,
                    format!(
                        "cannot fetch subject {subject}, which schema id {id} of record {}/{}@{} refers to",
                        at.topic, at.partition, at.offset
                    ),
                )
                .with_source(source));
            }
            Err(why) => {
                return Err(self.lookup.refuse(
                    id,
                    at,
                    format!("is written with schema id {id}, a Protobuf schema that cannot be read: {why}"),
                ));
            }
        };
        self.files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, file.clone());
        Ok(file)
    }

    /// The message `path` names in writer `file` (schema `id`) when it may be read as the reader's columns; why
    /// not, as the end of a sentence about a record.
    fn accept(
        &self,
        generations: &mut Vec<Arc<Columns>>,
        id: u32,
        file: &FileDescriptor,
        path: &[usize],
    ) -> std::result::Result<MessageDescriptor, String> {
        let message = message_path::message_at(file, path)
            .map_err(|why| format!("is written with schema id {id} and {why}"))?;
        if message.full_name() != self.message {
            return Err(format!(
                "is a {} message (schema id {id}), and the columns are message {}'s: read each message type \
                 with its own job (subject_strategy and record_name pick the reader's)",
                message.full_name(),
                self.message
            ));
        }
        let writer = columns::columns(&message)
            .map_err(|why| format!("is written with schema id {id}, whose {why}"))?;
        let current = generations.last().expect("generation 0 always exists");
        let mut changes = Vec::new();
        let presence = self.evolution.changes_columns();
        let evolved =
            columns::evolved_columns(&writer, &current.columns, "", presence, &mut changes)
                .map_err(|why| {
                    format!(
                        "is written with schema id {id}, which {} cannot read: {why}",
                        self.reader.named()
                    )
                })?;
        if changes.is_empty() {
            return Ok(message);
        }
        let named = |kinds: &[Change]| -> Vec<String> {
            changes
                .iter()
                .filter(|(_, c)| kinds.contains(c))
                .map(|(path, _)| format!("`{path}`"))
                .collect()
        };
        let added = named(&[Change::Added]);
        let changed = named(&[Change::AddedNested, Change::Widened, Change::Optional]);
        let refuse = |fields: &[String], what: &str, how: &str| {
            format!(
                "is written with schema id {id}, which {what} field{} {} that {} {}; the job stops rather than {} \
                 ({how})",
                if fields.len() == 1 { "" } else { "s" },
                fields.join(", "),
                self.reader.named(),
                if what == "has" {
                    "lacks"
                } else {
                    "reads narrower"
                },
                if what == "has" {
                    "drop their values"
                } else {
                    "change their values"
                },
            )
        };
        if !added.is_empty() && !self.evolution.adds_columns() {
            return Err(refuse(
                &added,
                "has",
                "with evolution = \"add-columns\" on every sink they would become columns",
            ));
        }
        if !changed.is_empty() && !self.evolution.changes_columns() {
            return Err(refuse(
                &changed,
                "widens, makes optional or adds nested",
                "with evolution = \"evolve\" on every sink the columns would take them",
            ));
        }
        let columns = Columns::new(current.number + 1, evolved);
        tracing::info!(id, changes = ?changes, generation = columns.number,
            "schema registry: Protobuf columns widened for a writer's fields");
        let number = columns.number;
        generations.push(Arc::new(columns));
        self.generation.store(number, Ordering::Release);
        Ok(message)
    }
}

/// [`compile`] of an owned schema (the future the lookup blocks on borrows nothing of the caller's).
async fn compile_owned(
    registry: SchemaRegistry,
    schema: RegisteredSchema,
) -> std::result::Result<FileDescriptor, ProtobufSchemaError> {
    compile(&registry, &schema).await
}

/// The rows of one batch of Protobuf values under construction, in one generation of the columns.
pub(crate) struct ProtobufRows {
    decoding: ProtobufDecoding,
    columns: Arc<Columns>,
    rows: MessageRows,
    /// Each writer message accepted in this batch (by schema id and path), with its fast path when it has one:
    /// a record of a known writer needs no lookup in the shared (locked) writers.
    plans: Vec<WriterPlan>,
}

/// A writer message (its schema id and message-index path), its descriptor, and its fast path when it has one.
type WriterPlan = ((u32, Vec<usize>), MessageDescriptor, Option<FlatPlan>);

impl ProtobufRows {
    /// Builders for up to `capacity` rows of `decoding`'s current columns.
    pub(crate) fn new(decoding: &ProtobufDecoding, capacity: usize) -> Self {
        let columns = decoding.columns();
        Self {
            rows: MessageRows::new(&columns.columns, capacity),
            decoding: decoding.clone(),
            columns,
            plans: Vec::new(),
        }
    }

    /// Appends the message of `value` (the record at `at`): straight from the wire when its columns allow
    /// ([`wire`]), else through a `DynamicMessage`.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record: not framed, a refused schema id or message, a body
    /// that is not the message, a value that does not fit its column (the builders are then unusable); a registry
    /// that cannot be reached as for [`ProtoWriters::resolve`].
    pub(crate) fn append(&mut self, at: RecordAt<'_>, value: &[u8], role: &str) -> Result<()> {
        let (id, path, body) = framing(at, value)?;
        let misfit = |why: rows::ValueError, decoding: &ProtobufDecoding| {
            bad_record(
                at,
                &format!(
                    "has a {role} that does not fit the columns of {}: {why}",
                    decoding.reader_schema().named()
                ),
            )
        };
        // A batch meets few writers: a scan finds the plan without hashing the path.
        let known = self
            .plans
            .iter()
            .position(|(known, _, _)| known.0 == id && known.1 == path);
        let index = match known {
            Some(index) => index,
            None => {
                let descriptor = self.decoding.writers.resolve(id, &path, at)?;
                let plan = FlatPlan::new(&descriptor, &self.columns.columns);
                self.plans.push(((id, path), descriptor, plan));
                self.plans.len() - 1
            }
        };
        let (_, descriptor, plan) = &self.plans[index];
        if let Some(plan) = plan {
            match plan.decode(body, &mut self.rows) {
                Ok(()) => return Ok(()),
                Err(FlatError::Invalid(why)) => {
                    return Err(not_the_message(at, id, descriptor, &why));
                }
                Err(FlatError::Value(why)) => return Err(misfit(why, &self.decoding)),
                Err(FlatError::General) => {} // a repeated nested message (merged) or a group
            }
        }
        let message = DynamicMessage::decode(descriptor.clone(), body)
            .map_err(|e| not_the_message(at, id, descriptor, &e.to_string()))?;
        self.rows
            .append(&message)
            .map_err(|why| misfit(why, &self.decoding))
    }

    /// The schema of these rows.
    pub(crate) fn schema(&self) -> SchemaRef {
        self.columns.schema.clone()
    }

    /// Whether the decoding's columns widened since these builders were made.
    pub(crate) fn outdated(&self) -> bool {
        self.decoding.writers.generation.load(Ordering::Acquire) != self.columns.number
    }

    /// The batch of every row appended.
    ///
    /// # Errors
    /// [`Bug`](ErrorKind::Bug) when the columns do not make the schema.
    pub(crate) fn finish(mut self) -> Result<RecordBatch> {
        let count = self.rows.len();
        let columns: Vec<ArrayRef> = self.rows.finish().map_err(|e| {
            Error::bug(Phase::Write, "the Protobuf columns do not make arrays").with_source(e)
        })?;
        RecordBatch::try_new_with_options(
            self.columns.schema.clone(),
            columns,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(count)),
        )
        .map_err(|e| {
            Error::bug(
                Phase::Write,
                "the Protobuf columns do not match their schema",
            )
            .with_source(e)
        })
    }
}

/// Schemas compiled for the unit tests, over a registry that is never asked (its address answers nothing).
#[cfg(test)]
pub(crate) mod test_files {
    use prost_reflect::FileDescriptor;
    use schema_registry::{RegisteredSchema, RegistrySettings, SchemaRegistry, SchemaType};

    /// A registry client whose address answers nothing.
    pub(crate) fn registry() -> SchemaRegistry {
        SchemaRegistry::new(&RegistrySettings::new("http://127.0.0.1:9/")).unwrap()
    }

    /// `source` registered as Protobuf schema `id`, without references.
    pub(crate) fn registered(id: u32, source: &str) -> RegisteredSchema {
        RegisteredSchema {
            id,
            schema: source.to_string(),
            schema_type: SchemaType::Protobuf,
            references: Vec::new(),
            version: None,
        }
    }

    /// `source` compiled (as schema id 1).
    pub(crate) async fn compiled(source: &str) -> FileDescriptor {
        schema_registry::protobuf::compile(&registry(), &registered(1, source))
            .await
            .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int64Type, TimestampMicrosecondType};
    use prost_reflect::prost::Message;
    use prost_reflect::{ReflectMessage, Value};

    use super::*;

    const ORDERS: &str = r#"syntax = "proto3"; package shop;
        import "google/protobuf/timestamp.proto"; import "google/protobuf/wrappers.proto";
        import "google/protobuf/struct.proto";
        message Order {
          int64 id = 1; string note = 2; optional int32 qty = 3; google.protobuf.Timestamp at = 4;
          google.protobuf.Int64Value maybe = 5; enum Status { NEW = 0; PAID = 1; } Status status = 6;
          message Line { string sku = 1; uint32 count = 2; } repeated Line lines = 7;
          map<string, int64> tags = 8; oneof pay { string card = 9; bytes iban = 10; }
          google.protobuf.Struct attrs = 11;
        }"#;

    const AT: RecordAt<'static> = RecordAt {
        topic: "orders",
        partition: 0,
        offset: 4,
    };

    use super::test_files::{compiled as file, registered, registry};

    /// The decoding of `reader` (id 1) with `writers` (by id) compiled as a registry lookup would have; a registry
    /// that is never asked.
    async fn decoding(
        reader: &str,
        writers: &[(u32, &str)],
        evolution: Evolution,
    ) -> ProtobufDecoding {
        let reader_file = file(reader).await;
        let decoding = ProtobufDecoding::from_registry(
            registry(),
            ReaderSchema::latest(&registered(1, reader)),
            &reader_file,
            None,
            evolution,
        )
        .unwrap();
        let mut compiled = vec![(1, reader_file)];
        for (id, source) in writers {
            compiled.push((*id, file(source).await));
        }
        decoding.writers.files.lock().unwrap().extend(compiled);
        decoding
    }

    fn framed(id: u32, message: &DynamicMessage) -> Vec<u8> {
        let mut value = vec![0];
        value.extend(id.to_be_bytes());
        value.push(0);
        value.extend(message.encode_to_vec());
        value
    }

    fn order(decoding: &ProtobufDecoding, fields: &[(&str, Value)]) -> DynamicMessage {
        let file = decoding
            .writers
            .files
            .lock()
            .unwrap()
            .get(&1)
            .unwrap()
            .clone();
        let mut message = DynamicMessage::new(file.messages().next().unwrap());
        for (name, value) in fields {
            message.set_field_by_name(name, value.clone());
        }
        message
    }

    fn child(parent: &DynamicMessage, field: &str, fields: &[(&str, Value)]) -> Value {
        let descriptor = parent.descriptor().get_field_by_name(field).unwrap();
        let prost_reflect::Kind::Message(kind) = descriptor.kind() else {
            panic!("{field}")
        };
        let mut message = DynamicMessage::new(kind);
        for (name, value) in fields {
            message.set_field_by_name(name, value.clone());
        }
        Value::Message(message)
    }

    #[tokio::test]
    async fn every_field_lands_in_its_column_exactly() {
        let decoding = decoding(ORDERS, &[], Evolution::None).await;
        let mut full = order(
            &decoding,
            &[("id", Value::I64(7)), ("note", Value::String("n".into()))],
        );
        let at = child(
            &full,
            "at",
            &[
                ("seconds", Value::I64(1_700_000_000)),
                ("nanos", Value::I32(123_456_000)),
            ],
        );
        let maybe = child(&full, "maybe", &[("value", Value::I64(-5))]);
        full.set_field_by_name("at", at);
        full.set_field_by_name("maybe", maybe);
        full.set_field_by_name("qty", Value::I32(0));
        full.set_field_by_name("status", Value::EnumNumber(1));
        full.set_field_by_name("card", Value::String("4111".into()));
        let line = {
            let lines = full.descriptor().get_field_by_name("lines").unwrap();
            let prost_reflect::Kind::Message(kind) = lines.kind() else {
                panic!()
            };
            let mut line = DynamicMessage::new(kind);
            line.set_field_by_name("sku", Value::String("a".into()));
            line.set_field_by_name("count", Value::U32(4_000_000_000));
            Value::Message(line)
        };
        full.set_field_by_name("lines", Value::List(vec![line]));
        full.set_field_by_name(
            "tags",
            Value::Map(
                [("b", 2), ("a", 1)]
                    .into_iter()
                    .map(|(k, v)| (prost_reflect::MapKey::String(k.into()), Value::I64(v)))
                    .collect(),
            ),
        );
        let empty = order(&decoding, &[("id", Value::I64(8))]);
        let mut rows = ProtobufRows::new(&decoding, 4);
        rows.append(AT, &framed(1, &full), "value").unwrap();
        rows.append(AT, &framed(1, &empty), "value").unwrap();
        let batch = rows.finish().unwrap();
        assert_eq!(batch.num_rows(), 2);
        let column = |name: &str| batch.column_by_name(name).unwrap().clone();
        assert_eq!(column("id").as_primitive::<Int64Type>().values(), &[7, 8]);
        // proto3 `optional` keeps presence: 0 set is 0, unset is null; an implicit string unset is "".
        let qty = column("qty");
        assert_eq!((qty.is_valid(0), qty.is_null(1)), (true, true));
        assert_eq!(column("note").as_string::<i32>().value(1), "");
        let at = column("at");
        assert_eq!(
            at.as_primitive::<TimestampMicrosecondType>().value(0),
            1_700_000_000_123_456
        );
        assert!(at.is_null(1));
        let maybe = column("maybe");
        assert_eq!(maybe.as_primitive::<Int64Type>().value(0), -5);
        assert!(maybe.is_null(1));
        let status = column("status");
        let status = status.as_dictionary::<arrow_array::types::Int32Type>();
        let names = status.values().as_string::<i32>();
        assert_eq!(names.value(status.keys().value(0) as usize), "PAID");
        assert_eq!(names.value(status.keys().value(1) as usize), "NEW");
        let (card, iban) = (column("card"), column("iban"));
        assert_eq!(card.as_string::<i32>().value(0), "4111");
        assert!(iban.is_null(0) && card.is_null(1));
        let lines = column("lines");
        let lines = lines.as_list::<i32>();
        assert_eq!((lines.value_length(0), lines.value_length(1)), (1, 0));
        let tags = column("tags");
        let tags = tags.as_map();
        assert_eq!(
            tags.keys().as_string::<i32>().iter().collect::<Vec<_>>(),
            [Some("a"), Some("b")]
        );
        assert!(column("attrs").is_null(0));
    }

    #[tokio::test]
    async fn values_that_would_change_are_bad_records_naming_the_field() {
        let decoding = decoding(ORDERS, &[], Evolution::None).await;
        let mut nanos = order(&decoding, &[("id", Value::I64(1))]);
        let at = child(
            &nanos,
            "at",
            &[("seconds", Value::I64(1)), ("nanos", Value::I32(1))],
        );
        nanos.set_field_by_name("at", at);
        let err = ProtobufRows::new(&decoding, 1)
            .append(AT, &framed(1, &nanos), "value")
            .unwrap_err();
        let text = err.to_string();
        assert_eq!(err.kind(), ErrorKind::BadRecord);
        assert!(
            text.contains("orders/0@4")
                && text.contains("field `at`")
                && text.contains("nanoseconds"),
            "{text}"
        );
        let mut unknown = order(&decoding, &[("id", Value::I64(1))]);
        unknown.set_field_by_name("status", Value::EnumNumber(9));
        let err = ProtobufRows::new(&decoding, 1)
            .append(AT, &framed(1, &unknown), "value")
            .unwrap_err();
        assert!(
            err.to_string().contains("field `status` has number 9"),
            "{err}"
        );
        for (value, part) in [
            (
                &b"\x00\x00\x00\x00\x01\x00\xff"[..],
                "is not a shop.Order message",
            ),
            (b"{}", "wire format"),
            (b"\x00\x00\x00\x00\x01\x02\x02", "names message index 1"),
        ] {
            let err = ProtobufRows::new(&decoding, 1)
                .append(AT, value, "value")
                .unwrap_err();
            assert!(err.to_string().contains(part), "{part}: {err}");
        }
    }

    const NARROW: &str = r#"syntax = "proto3"; package shop;
        message Order { int64 id = 1; string note = 2; message Line { string sku = 1; } Line line = 4; }"#;
    /// Field 2 renamed, field 3 new.
    const WIDER: &str = r#"syntax = "proto3"; package shop;
        message Order { int64 id = 1; string title = 2; int64 qty = 3; message Line { string sku = 1; } Line line = 4; }"#;
    /// A field new inside `line`.
    const NESTED: &str = r#"syntax = "proto3"; package shop;
        message Order { int64 id = 1; string note = 2; message Line { string sku = 1; int32 n = 2; } Line line = 4; }"#;
    const RETYPED: &str = r#"syntax = "proto3"; package shop; message Order { string id = 1; }"#;

    #[tokio::test]
    async fn writers_read_by_field_number_and_new_fields_evolve_or_are_refused() {
        let evolving = decoding(
            NARROW,
            &[(2, WIDER), (3, NESTED), (5, RETYPED)],
            Evolution::AddColumns,
        )
        .await;
        evolving.writers.resolve(2, &[], AT).unwrap();
        // The renamed field stays on its column; the new one is a nullable column of the next generation.
        let schema = evolving.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["id", "note", "line", "qty"]);
        assert!(schema.field(3).is_nullable());
        assert_eq!(evolving.columns().number, 1);
        let err = evolving
            .writers
            .resolve(3, &[], AT)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`line.n`") && err.contains("evolve"), "{err}");
        let err = evolving
            .writers
            .resolve(5, &[], AT)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`id`") && err.contains("schema id 5"), "{err}");
        let fixed = decoding(NARROW, &[(2, WIDER)], Evolution::None).await;
        let err = fixed.writers.resolve(2, &[], AT).unwrap_err().to_string();
        assert!(
            err.contains("`qty`") && err.contains("add-columns"),
            "{err}"
        );
        assert_eq!(fixed.columns().number, 0);
    }

    /// `qty` widened to int64, `ratio` to double, `note` given presence, `line.n` new: one generation with all.
    const EVOLVED: &str = r#"syntax = "proto3"; package shop;
        message Order { int64 id = 1; optional string note = 2; int64 qty = 3; double ratio = 5;
            message Line { string sku = 1; int32 n = 2; } Line line = 4; }"#;
    const TYPED: &str = r#"syntax = "proto3"; package shop;
        message Order { int64 id = 1; string note = 2; int32 qty = 3; float ratio = 5;
            message Line { string sku = 1; } Line line = 4; }"#;

    #[tokio::test]
    async fn with_evolve_wider_scalars_presence_and_nested_fields_widen_the_columns() {
        let evolving = decoding(TYPED, &[(2, EVOLVED), (3, TYPED)], Evolution::Evolve).await;
        evolving.writers.resolve(2, &[], AT).unwrap();
        let schema = evolving.schema();
        let described = |name: &str| {
            let f = schema.field_with_name(name).unwrap();
            format!("{} {}", f.data_type(), f.is_nullable())
        };
        assert_eq!(described("note"), "Utf8 true");
        assert_eq!(described("qty"), "Int64 false");
        assert_eq!(described("ratio"), "Float64 false");
        let arrow_schema::DataType::Struct(line) =
            schema.field_with_name("line").unwrap().data_type()
        else {
            panic!("{schema:?}")
        };
        assert_eq!(line.len(), 2);
        assert!(line[1].is_nullable());
        assert_eq!(evolving.columns().number, 1);
        // The older writer reads into the widened columns as it is.
        evolving.writers.resolve(3, &[], AT).unwrap();
        assert_eq!(evolving.columns().number, 1);
        // Without evolve the same writer is refused, naming what it changes and the setting.
        let adding = decoding(TYPED, &[(2, EVOLVED)], Evolution::AddColumns).await;
        let err = adding.writers.resolve(2, &[], AT).unwrap_err().to_string();
        for expected in ["`qty`", "`ratio`", "`line.n`", "evolve"] {
            assert!(err.contains(expected), "{expected} in {err}");
        }
        assert!(!err.contains("`note`"), "presence is evolve's only: {err}");
    }
}
