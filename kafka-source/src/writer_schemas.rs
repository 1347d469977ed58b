//! Writer schemas looked up in a schema registry by the id each Confluent-framed record carries, checked against
//! the reader schema (the columns follow it) before any record of them is decoded.
//!
//! A writer schema is accepted when arrow-avro can resolve it to the reader schema (Avro's schema resolution: a
//! field the writer lacks takes the reader's default, a type may be promoted, e.g. `int` to `long`) and it has no
//! field the reader schema lacks: such a field's values would be dropped without a word, so the record is refused
//! instead, naming the field and both schema ids, unless the decoding evolves (`add-columns`): then the reader
//! schema is widened with the writer's new top-level fields (nullable, default null, so older records still read),
//! a new *generation* of the reader whose batches have the new columns. With `evolve`, a writer whose top-level
//! field is wider than the reader's (`int` to `long`, `float` to `double`, a decimal's precision up at the same
//! scale) or optional where the reader's is required also makes a new generation, with the writer's type for that
//! field: older writers still resolve to it (Avro promotes their narrower values). Refusals are
//! [`BadRecord`](ErrorKind::BadRecord)s (a job with dead letters sends the records there); a registry that cannot
//! be reached is [`Retryable`](ErrorKind::Retryable) and never dead-letters anything.
//!
//! Lookups go through [`RegistryLookup`] (on the consumer thread, bounded, refusals remembered). Ids are looked up
//! once: accepted schemas and refusals are remembered for the life of the source.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use arrow_avro::reader::{Decoder, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use arrow_schema::{ArrowError, SchemaRef};
use connector_api::{Error, ErrorKind, Evolution, Phase, Result};
use schema_registry::{RegisteredSchema, SchemaType};
use serde_json::Value;

use crate::avro_fields::{
    added_fields, ambiguous_fields, promoted, promoted_fields, resolution_reader, retyped_fields,
    widened,
};
use crate::record::RecordAt;
use crate::registry_lookup::{RegistryLookup, self_contained};

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

    pub(crate) fn named(&self) -> String {
        match self.id {
            Some(id) => format!("reader schema id {id} ({})", self.origin),
            None => self.origin.clone(),
        }
    }
}

/// One generation of the reader schema, with the Arrow schema of its rows.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    /// Its number: 0 for the reader the decoding started with, one more for each widening.
    pub(crate) number: usize,
    /// The reader schema.
    pub(crate) reader: ReaderSchema,
    /// The Arrow schema of the rows it decodes into.
    pub(crate) arrow: SchemaRef,
    /// The newest registry id this generation's reader was made from: the reader's own, or the writer that widened
    /// it last (`None`: a declared reader never widened). A writer with a smaller id is older than the reader.
    pub(crate) newest: Option<u32>,
}

/// A writer whose values need a reader of their own to keep their meaning ([`resolution_reader`]): decoded with
/// it, then converted to the reader generation's types exactly.
#[derive(Debug)]
pub(crate) struct Variant {
    /// The variant reader schema.
    pub(crate) reader: ReaderSchema,
    /// A store holding this writer only.
    pub(crate) store: SchemaStore,
}

/// Writer schemas by id, shared by every decoder of one decoding (and every subtask of a process).
pub(crate) struct WriterSchemas {
    lookup: RegistryLookup,
    /// How far the reader follows a writer: its new top-level fields (`add-columns`), also its widened and
    /// optional fields (`evolve`).
    evolution: Evolution,
    /// Change events (Debezium): an older writer's row-image fields the reader lacks (a column dropped from the
    /// table since) are left out, counted, instead of refused; a newer writer's are new columns of the rows.
    older_row_fields: bool,
    known: Mutex<Known>,
}

impl std::fmt::Debug for WriterSchemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterSchemas")
            .field("lookup", &self.lookup)
            .field("evolution", &self.evolution)
            .finish_non_exhaustive()
    }
}

/// The ids seen so far, and the reader's generations.
struct Known {
    generations: Vec<Arc<Generation>>,
    store: SchemaStore,
    /// Accepted ids, each with the first generation that reads it without dropping a field.
    ids: BTreeMap<u32, usize>,
    /// Accepted writers that need a reader of their own.
    variants: HashMap<u32, Arc<Variant>>,
    /// Accepted writers with row-image fields the reader lacks, left out.
    dropping: HashSet<u32>,
}

impl Known {
    fn current(&self) -> &Arc<Generation> {
        self.generations.last().expect("generation 0 always exists")
    }
}

/// A decoder for batches of up to `rows` rows that reads every writer schema in `store` as `reader`.
pub(crate) fn reading_as(
    store: SchemaStore,
    reader: &ReaderSchema,
    rows: usize,
) -> std::result::Result<Decoder, ArrowError> {
    ReaderBuilder::new()
        .with_batch_size(rows.max(1))
        .with_writer_schema_store(store)
        .with_reader_schema(AvroSchema::new(reader.schema.clone()))
        .build_decoder()
}

impl WriterSchemas {
    /// The reader of its own `writer` needs when its logical types differ from `generation`'s
    /// ([`resolution_reader`]), after checking that its values convert exactly to the generation's types; why
    /// not, as the end of a sentence about a record.
    fn variant(
        &self,
        generation: &Generation,
        writer: &RegisteredSchema,
        writer_json: &Value,
    ) -> std::result::Result<Option<Variant>, String> {
        let id = writer.id;
        let Ok(reader_json) = serde_json::from_str::<Value>(&generation.reader.schema) else {
            return Ok(None);
        };
        let Some(variant) = resolution_reader(&reader_json, writer_json) else {
            return Ok(None);
        };
        let reader = ReaderSchema {
            schema: variant.to_string(),
            id: None,
            origin: format!(
                "{} with schema id {id}'s logical types",
                generation.reader.origin
            ),
        };
        let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
        store
            .set(Fingerprint::Id(id), AvroSchema::new(writer.schema.clone()))
            .map_err(|e| format!("is written with schema id {id}, which does not parse: {e}"))?;
        let decoded = reading_as(store.clone(), &reader, 1)
            .map_err(|e| {
                format!("is written with schema id {id}, which arrow-avro cannot decode: {e}")
            })?
            .schema();
        for field in generation.arrow.fields() {
            let Ok(written) = decoded.field_with_name(field.name()) else {
                continue;
            };
            if let Err(refusal) =
                connector_api::types::exact::check(written.data_type(), field.data_type())
            {
                let refusal = refusal.under(field.name());
                return Err(format!(
                    "is written with schema id {id}, whose field `{}` {} as {} reads it: converting would change \
                     its values",
                    refusal.path,
                    refusal.why,
                    generation.reader.named()
                ));
            }
        }
        Ok(Some(Variant { reader, store }))
    }

    /// Writer schemas looked up through `lookup`, read as `reader` (widened as `evolution` allows).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the reader schema does not parse or has no Arrow equivalent.
    pub(crate) fn new(
        lookup: RegistryLookup,
        reader: ReaderSchema,
        evolution: Evolution,
        older_row_fields: bool,
    ) -> Result<Self> {
        let config = |what: &str, e: ArrowError| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("{} {what}", reader.named()),
            )
            .with_source(e)
        };
        let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
        let mut ids = BTreeMap::new();
        // The reader schema's own records need no lookup (a declared one gets an id no record carries: 0 is
        // never a registry id, and the decoder is only asked for ids it was given).
        let id = reader.id.unwrap_or(0);
        store
            .set(Fingerprint::Id(id), AvroSchema::new(reader.schema.clone()))
            .map_err(|e| config("does not parse", e))?;
        if reader.id.is_some() {
            ids.insert(id, 0);
        }
        let arrow = reading_as(store.clone(), &reader, 1)
            .map_err(|e| config("has no Arrow equivalent", e))?
            .schema();
        Ok(Self {
            lookup,
            evolution,
            older_row_fields,
            known: Mutex::new(Known {
                generations: vec![Arc::new(Generation {
                    number: 0,
                    newest: reader.id,
                    reader,
                    arrow,
                })],
                store,
                ids,
                variants: HashMap::new(),
                dropping: HashSet::new(),
            }),
        })
    }

    /// The current generation of the reader schema.
    pub(crate) fn current(&self) -> Arc<Generation> {
        self.lock().current().clone()
    }

    /// The accepted writer schemas (the reader's own among them), and their ids with the first reader generation
    /// that reads each.
    pub(crate) fn snapshot(&self) -> (SchemaStore, BTreeMap<u32, usize>) {
        let known = self.lock();
        (known.store.clone(), known.ids.clone())
    }

    /// The reader of its own writer `id` needs, if it needs one.
    pub(crate) fn variant_of(&self, id: u32) -> Option<Arc<Variant>> {
        self.lock().variants.get(&id).cloned()
    }

    /// Whether records of writer `id` have row-image fields the reader lacks, left out.
    pub(crate) fn drops_fields(&self, id: u32) -> bool {
        self.lock().dropping.contains(&id)
    }

    /// The first generation that reads writer schema `id`, if accepted.
    pub(crate) fn generation_of(&self, id: u32) -> Option<usize> {
        self.lock().ids.get(&id).copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes sure writer schema `id`, which the record at `at` carries, is known and accepted (widening the reader
    /// when the decoding evolves and the schema adds top-level fields).
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record when the registry has no such id or the schema is
    /// refused (another schema type, references, a field the reader lacks and may not gain, not resolvable to the
    /// reader); [`Retryable`](ErrorKind::Retryable) when the registry cannot be reached (after the client's
    /// retries), any other registry error as [`Config`](ErrorKind::Config).
    pub(crate) fn resolve(&self, id: u32, at: RecordAt<'_>) -> Result<()> {
        if self.lock().ids.contains_key(&id) {
            return Ok(());
        }
        if let Some(refusal) = self.lookup.refusal(id, at) {
            return Err(refusal);
        }
        let writer = self.lookup.fetch(id, at)?;
        let mut known = self.lock();
        if known.ids.contains_key(&id) {
            return Ok(()); // another thread accepted it meanwhile
        }
        self.accept(&mut known, &writer)
            .map_err(|why| self.lookup.refuse(id, at, why))
    }

    /// Accepts `writer` under the current reader, or a widened one; why not, as the end of a sentence about a
    /// record.
    fn accept(
        &self,
        known: &mut Known,
        writer: &RegisteredSchema,
    ) -> std::result::Result<(), String> {
        let id = writer.id;
        let current = known.current().clone();
        let reader = current.reader.named();
        self_contained(
            writer,
            SchemaType::Avro,
            "this decoding reads Avro",
            "those types",
        )?;
        let parsed = |text: &str| serde_json::from_str::<Value>(text);
        let (Ok(writer_json), Ok(reader_json)) =
            (parsed(&writer.schema), parsed(&current.reader.schema))
        else {
            return Err(format!(
                "is written with schema id {id}, which is not Avro schema JSON"
            ));
        };
        let ambiguous = ambiguous_fields(&writer_json, &reader_json);
        if !ambiguous.is_empty() {
            return Err(format!(
                "is written with schema id {id}, whose field(s) {} are renamed from a name another of its fields \
                 now has, so {} would read that other field in their place and drop their values: give the new \
                 field another name",
                ambiguous.join(", "),
                current.reader.named()
            ));
        }
        let mut added = Vec::new();
        added_fields(&writer_json, &reader_json, "", &mut added);
        let named = added
            .iter()
            .map(|f| format!("`{f}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut store = known.store.clone();
        store
            .set(Fingerprint::Id(id), AvroSchema::new(writer.schema.clone()))
            .map_err(|e| format!("is written with schema id {id}, which does not parse: {e}"))?;
        // Compared with the newest schema the reader was made from: after a widening its own id is gone, and a column
        // added again later (a newer writer) must widen it once more, not be taken for an older writer's leftover.
        let older = writer.id < current.newest.unwrap_or(u32::MAX);
        let only_row_images = added
            .iter()
            .all(|f| f.starts_with("before.") || f.starts_with("after."));
        let dropping = !added.is_empty() && self.older_row_fields && older && only_row_images;
        let adding = !added.is_empty() && !dropping;
        let promoting = promoted_fields(&reader_json, &writer_json);
        // A change event's new row-image fields are new columns of its rows, not nested fields.
        let nested: Vec<&String> = match self.older_row_fields && only_row_images {
            true => Vec::new(),
            false => added.iter().filter(|f| f.contains(['.', '['])).collect(),
        };
        if adding
            && self.evolution.adds_columns()
            && !self.evolution.changes_columns()
            && !nested.is_empty()
        {
            return Err(format!(
                "is written with schema id {id}, which adds the nested field{} {} that {reader} lacks; the job \
                 stops rather than drop {} (with evolution = \"evolve\" on every sink the nested column{} would \
                 gain {})",
                if nested.len() == 1 { "" } else { "s" },
                nested
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if nested.len() == 1 {
                    "its values"
                } else {
                    "their values"
                },
                if nested.len() == 1 { "" } else { "s" },
                if nested.len() == 1 { "it" } else { "them" },
            ));
        }
        if adding && !self.evolution.adds_columns() {
            return Err(format!(
                "is written with schema id {id}, which has field{} {named} that {reader} lacks; the job stops \
                 rather than drop {} (a sink with evolution = \"add-columns\" would add {})",
                if added.len() == 1 { "" } else { "s" },
                if added.len() == 1 {
                    "its values"
                } else {
                    "their values"
                },
                if added.len() == 1 {
                    "the column"
                } else {
                    "the columns"
                },
            ));
        }
        let promoting = match self.evolution.changes_columns() {
            true => promoting,
            false => {
                if !promoting.is_empty() {
                    tracing::debug!(id, fields = ?promoting,
                        "schema registry: a writer widens fields; evolution = \"evolve\" would widen the columns");
                }
                Vec::new()
            }
        };
        let generation = if !adding && promoting.is_empty() {
            current.clone()
        } else {
            let mut next = reader_json.clone();
            let mut what = Vec::new();
            if adding {
                next = widened(&next, &writer_json, &added).map_err(|why| {
                    format!("is written with schema id {id}, which {why} (read as {reader})")
                })?;
                what.push(format!("with {named}"));
            }
            if !promoting.is_empty() {
                next = promoted(&next, &writer_json, &promoting);
                what.push(format!(
                    "with {} widened",
                    promoting
                        .iter()
                        .map(|f| format!("`{f}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            let reader = ReaderSchema {
                schema: next.to_string(),
                id: None,
                origin: format!(
                    "the reader schema {} from schema id {id} ({})",
                    what.join(" and "),
                    current.reader.origin
                ),
            };
            let arrow = reading_as(store.clone(), &reader, 1)
                .map_err(|e| {
                    format!(
                        "is written with schema id {id}, which cannot be read as {}: {e}",
                        reader.named()
                    )
                })?
                .schema();
            Arc::new(Generation {
                number: current.number + 1,
                reader,
                arrow,
                newest: Some(current.newest.map_or(id, |newest| newest.max(id))),
            })
        };
        // Every accepted writer, this one included, must resolve to the (possibly widened) reader.
        reading_as(store.clone(), &generation.reader, 1).map_err(|e| {
            let retyped = retyped_fields(&writer_json, &reader_json);
            let fields = match retyped.as_slice() {
                [] => String::new(),
                names => format!(
                    " (field{} {} changed type)",
                    if names.len() == 1 { "" } else { "s" },
                    names
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let hint = match self.evolution.changes_columns() {
                false if !promoted_fields(&reader_json, &writer_json).is_empty() => {
                    " (with evolution = \"evolve\" on every sink the column would be widened)"
                }
                _ => "",
            };
            format!(
                "is written with schema id {id}, which cannot be read as {}{fields}: {e}{hint}",
                generation.reader.named()
            )
        })?;
        let variant = self.variant(&generation, writer, &writer_json)?;
        known.store = store;
        known.ids.insert(id, generation.number);
        if let Some(variant) = variant {
            tracing::info!(id, reader = %generation.reader.named(),
                "schema registry: writer schema decoded as written and converted to the reader's types");
            known.variants.insert(id, Arc::new(variant));
        }
        if dropping {
            tracing::warn!(id, fields = %named, reader = %generation.reader.named(),
                "schema registry: an older writer schema has columns the reader lacks (dropped from the table \
                 since): their values are left out");
            known.dropping.insert(id);
        }
        if generation.number != current.number {
            tracing::info!(id, reader = %generation.reader.named(), generation = generation.number,
                "schema registry: reader schema widened for a writer's fields");
            known.generations.push(generation);
        } else {
            tracing::info!(id, reader = %reader, "schema registry: new writer schema accepted");
        }
        Ok(())
    }
}
