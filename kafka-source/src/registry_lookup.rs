//! Looking a record's schema id up in the schema registry, shared by the registry-backed decodings (Avro writer
//! schemas, JSON Schema): the lookup itself, bounded and asked again while the registry does not have the id yet,
//! and the memory of refused ids, so a refused id costs one lookup for the life of the source.
//!
//! Lookups happen on the consumer thread, which blocks on the async registry client through the handle of the
//! runtime the source was opened on (each request bounded and retried by the client). A refusal is a
//! [`BadRecord`](ErrorKind::BadRecord) (a job with dead letters sends the records there); a registry that cannot
//! be reached is [`Retryable`](ErrorKind::Retryable) and never dead-letters anything.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use connector_api::{Error, Phase, Result};
use schema_registry::{RegisteredSchema, SchemaRegistry, SchemaType};

use crate::record::{RecordAt, bad_record};

/// How long a registry that does not have a schema id is asked again before the record is refused (a replica
/// behind its leader catches up), and how long that refusal then stands before the next record asks again.
const NOT_FOUND_RETRY: Duration = Duration::from_secs(10);
const NOT_FOUND_REMEMBERED: Duration = Duration::from_secs(60);

/// The registry of one decoding, the runtime its lookups block on, and the ids it refused.
pub(crate) struct RegistryLookup {
    registry: SchemaRegistry,
    runtime: tokio::runtime::Handle,
    /// Why an id was refused; until when, for an id the registry did not have (asked again after that).
    refused: Mutex<HashMap<u32, (String, Option<Instant>)>>,
    /// The last id a decoding accepted, plus one (0: none yet): nearly every record carries the id of the one
    /// before, which is then known without taking the decoding's locks.
    last_accepted: AtomicU64,
}

impl std::fmt::Debug for RegistryLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryLookup")
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

impl RegistryLookup {
    /// Lookups in `registry`, blocking on the runtime this is called in.
    ///
    /// # Errors
    /// [`Bug`](ErrorKind::Bug) outside a tokio runtime.
    pub(crate) fn new(registry: SchemaRegistry) -> Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            Error::bug(
                Phase::Setup,
                "a registry-backed decoding is made outside a tokio runtime",
            )
            .with_source(e)
        })?;
        Ok(Self {
            registry,
            runtime,
            refused: Mutex::new(HashMap::new()),
            last_accepted: AtomicU64::new(0),
        })
    }

    /// Whether `id` is the last id noted accepted ([`Self::note_accepted`]): a decoding never forgets an id it
    /// accepted, so a stale answer is still a right one.
    pub(crate) fn accepted_last(&self, id: u32) -> bool {
        // Acquire: a caller that sees the id also sees the columns its acceptance widened (the generation number
        // stored before it).
        self.last_accepted.load(Ordering::Acquire) == u64::from(id) + 1
    }

    /// Notes `id` as accepted by the decoding.
    pub(crate) fn note_accepted(&self, id: u32) {
        self.last_accepted
            .store(u64::from(id) + 1, Ordering::Release);
    }

    fn refusals(&self) -> std::sync::MutexGuard<'_, HashMap<u32, (String, Option<Instant>)>> {
        self.refused.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The refusal of schema `id`, which the record at `at` carries, if it was refused (and, for an id the registry
    /// did not have, not long enough ago to ask again).
    pub(crate) fn refusal(&self, id: u32, at: RecordAt<'_>) -> Option<Error> {
        match self.refusals().get(&id) {
            Some((why, None)) => Some(bad_record(at, why)),
            Some((why, Some(until))) if Instant::now() < *until => Some(bad_record(at, why)),
            _ => None,
        }
    }

    /// Remembers that schema `id` is refused for `why` (the end of a sentence about a record) and returns the
    /// refusal of the record at `at`.
    pub(crate) fn refuse(&self, id: u32, at: RecordAt<'_>, why: String) -> Error {
        tracing::warn!(id, %why, "schema registry: schema refused");
        let error = bad_record(at, &why);
        self.refusals().insert(id, (why, None));
        error
    }

    /// Schema `id`, which the record at `at` carries, from the registry.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) when the registry does not have it after [`NOT_FOUND_RETRY`]
    /// (remembered for [`NOT_FOUND_REMEMBERED`]); the registry error's own kind otherwise
    /// ([`Retryable`](ErrorKind::Retryable) when it cannot be reached after the client's retries).
    pub(crate) fn fetch(&self, id: u32, at: RecordAt<'_>) -> Result<RegisteredSchema> {
        match self.runtime.block_on(self.lookup(id)) {
            Ok(schema) => Ok(schema),
            Err(e) if e.is_not_found() => {
                let why = format!(
                    "carries schema id {id}, which the schema registry at {} does not have (asked for {:?})",
                    self.registry.url(),
                    NOT_FOUND_RETRY
                );
                let until = Instant::now() + NOT_FOUND_REMEMBERED;
                self.refusals().insert(id, (why.clone(), Some(until)));
                Err(bad_record(at, &why))
            }
            Err(e) => Err(Error::new(
                e.kind(),
                Phase::Write,
                format!(
                    "cannot look up schema id {id} of record {}/{}@{}",
                    at.topic, at.partition, at.offset
                ),
            )
            .with_source(e)),
        }
    }

    /// Runs `request` of the registry to its end on the consumer thread (each request in it bounded and retried by
    /// the client).
    pub(crate) fn block_on<F: std::future::Future>(
        &self,
        request: impl FnOnce(SchemaRegistry) -> F,
    ) -> F::Output {
        self.runtime.block_on(request(self.registry.clone()))
    }

    /// Schema `id` from the registry; a registry that does not have it (a replica behind its leader) is asked
    /// again for [`NOT_FOUND_RETRY`], logged, before it counts as not found.
    async fn lookup(
        &self,
        id: u32,
    ) -> std::result::Result<RegisteredSchema, schema_registry::RegistryError> {
        let deadline = Instant::now() + NOT_FOUND_RETRY;
        let mut pause = Duration::from_millis(250);
        loop {
            match self.registry.schema(id).await {
                Err(e) if e.is_not_found() && Instant::now() + pause < deadline => {
                    tracing::warn!(id, registry = %self.registry.url(), "schema registry: schema id not found; asking again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }
}

/// Refuses `writer` unless it is a self-contained schema of kind `expected` (schema references to other subjects
/// are not resolved); `reads` says what the decoding reads, `inline` what to inline instead. Why not, as the end of
/// a sentence about a record.
pub(crate) fn self_contained(
    writer: &RegisteredSchema,
    expected: SchemaType,
    reads: &str,
    inline: &str,
) -> std::result::Result<(), String> {
    let id = writer.id;
    if writer.schema_type != expected {
        return Err(format!(
            "is written with schema id {id}, a {} schema; {reads}",
            writer.schema_type
        ));
    }
    if !writer.references.is_empty() {
        let names: Vec<&str> = writer.references.iter().map(|r| r.name.as_str()).collect();
        return Err(format!(
            "is written with schema id {id}, which refers to other subjects' schemas ({}); schema references \
             are not resolved: register the schema with {inline} inlined",
            names.join(", ")
        ));
    }
    Ok(())
}

/// The schema id of a Confluent-framed value (`0x00`, 4-byte big-endian id, body).
pub(crate) fn confluent_id(value: &[u8]) -> Option<u32> {
    match value {
        [0, a, b, c, d, ..] => Some(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}
