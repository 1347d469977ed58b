//! One way to build any sink: a `[[sinks]]` entry of a job file names its `type`, its `id` and its `delivery`
//! guarantee next to the sink's own settings, and a [`SinkRegistry`] turns it into a [`DynSink`] the driver takes,
//! without code per sink in the job.
//!
//! ```toml
//! [[sinks]]
//! type = "kafka"
//! id = "orders-out"
//! delivery = "exactly-once"
//! bootstrap_servers = "127.0.0.1:19092"
//! topic = "orders-copy"
//! transactional_id_prefix = "orders-job-out"
//!
//! [[sinks]]
//! type = "file"
//! id = "orders-archive"
//! delivery = "at-least-once"
//! storage = { kind = "local", path = "/data/orders" }
//! ```
//!
//! Each sink crate implements [`SinkBuilder`] for its `type`: a typed settings struct (serde with
//! `deny_unknown_fields`) and how an instance is built and checked from it and the job's [`SinkContext`]. Every
//! builder is a [`SinkFactory`] through one blanket impl, which parses the settings (a misspelt key is refused
//! naming the sink, with "did you mean"), so a sink's factory is its settings and two short methods, the way
//! iceberg-rust's `CatalogBuilder` turns properties into a catalog.

use std::collections::BTreeMap;
use std::time::Duration;

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::driver::{ErasedSink, IgnoringSink, Kept};
use crate::{
    DeliveryGuarantee, Error, ErrorKind, GuaranteedSink, JobId, Phase, Result, SinkId, SinkScope,
    SubtaskId, TwoPhaseCommit,
};

/// One `[[sinks]]` entry: the keys every sink has, and the sink's own settings.
#[derive(Debug, Clone, Deserialize)]
pub struct SinkSpec {
    /// Which factory builds it (`kafka`, `file`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The sink's id in the job: scopes everything it owns in the external system.
    pub id: SinkId,
    /// Its delivery guarantee (`exactly-once` by default).
    #[serde(default)]
    pub delivery: DeliveryGuarantee,
    /// Whether it takes new columns when the source's schema gains fields (`none` by default).
    #[serde(default)]
    pub evolution: Evolution,
    /// A SQL query over what the job's transforms give (the table `input`) for what only this sink receives
    /// (a PII-free copy, fewer columns): applied by the worker before the sink, not by the sink itself. The
    /// sink is built for the query's output schema.
    #[serde(default)]
    pub select: Option<String>,
    /// Everything else: the sink's own config, read by its factory.
    #[serde(flatten)]
    pub settings: serde_json::Map<String, serde_json::Value>,
}

/// What a factory gets besides the sink's own settings.
#[derive(Debug, Clone)]
pub struct SinkContext {
    /// The job the sink belongs to, when what it owns is scoped by the job ([`SinkScope`]): everything the sink
    /// keeps in its external system is then named after the job and the sink, so two jobs never interfere. `None`
    /// for sinks without a job, and for jobs the worker first ran before sinks were scoped by their job (their names
    /// stay as they were: the sink id alone). A sink's own `job`/`scope`/prefix setting overrides it.
    pub job: Option<JobId>,
    /// The sink's id.
    pub sink: SinkId,
    /// The subtask this instance serves.
    pub subtask: SubtaskId,
    /// The schema of the batches it will be given.
    pub schema: SchemaRef,
    /// Whether it takes new columns ([`TwoPhaseCommit::evolve`]) when the batches' schema gains some, and adds
    /// the schema's columns its external system lacks when it opens.
    pub evolution: Evolution,
}

/// `evolution` of a `[[sinks]]` entry: what a sink does when the source's schema changes (a schema registry's
/// writer schema added fields, widened a type or made a field optional). The modes are ordered: each takes what
/// the one before it takes, and a job evolves as far as its least evolving sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Evolution {
    /// Never changes the external system's schema: a record with a new field stops the job, naming the field
    /// (or goes to the dead-letter topic), and a table that lacks a column of the batches is refused at start.
    #[default]
    None,
    /// Never changes the external system's schema, and leaves out of what it writes the columns of the batches
    /// its table lacks: the ones it lacked when the sink was built, and every column the batches gain while it
    /// runs (the values left out are counted, [`IGNORED_VALUES`](crate::metrics::IGNORED_VALUES)). For sinks that
    /// write into a table ([`SinkBuilder::lacking_columns`]). A widened or optional field is refused as under
    /// `AddColumns`: the source follows the writers that far for such a sink ([`Evolution::source_follows`]).
    Ignore,
    /// Adds the new columns (nullable) at a checkpoint boundary before any row of them is written, and at start
    /// the columns the external system lacks ([`TwoPhaseCommit::evolve`]).
    AddColumns,
    /// As `AddColumns`, and also widens a column's type the way every engine reads (int to long, float to double,
    /// a decimal's precision up at the same scale) and makes a required column optional ([`SchemaChange`](crate::SchemaChange)).
    Evolve,
}

impl Evolution {
    /// Whether new (nullable) columns are taken.
    pub fn adds_columns(self) -> bool {
        self >= Evolution::AddColumns
    }

    /// Whether widened types and columns made optional are taken.
    pub fn changes_columns(self) -> bool {
        self >= Evolution::Evolve
    }

    /// How far the source may follow the writers' schemas for a sink of this mode: `Ignore` takes new fields as
    /// the other modes do (the sink leaves them out), so as far as `AddColumns`; every other mode as far as itself.
    /// A job follows the least of its sinks'.
    pub fn source_follows(self) -> Evolution {
        match self {
            Evolution::Ignore => Evolution::AddColumns,
            other => other,
        }
    }

    /// The setting's value in a job file.
    pub fn as_str(self) -> &'static str {
        match self {
            Evolution::None => "none",
            Evolution::Ignore => "ignore",
            Evolution::AddColumns => "add-columns",
            Evolution::Evolve => "evolve",
        }
    }
}

impl SinkContext {
    /// Where the sink keeps its state unless its settings say otherwise: `<job>~<sink>`, or the sink id alone
    /// without a job.
    pub fn scope(&self) -> SinkScope {
        SinkScope::new(self.job.as_ref(), &self.sink)
    }
}

/// A sink of any type, with its delivery guarantee applied, ready for
/// [`Driver::add_dyn_sink`](crate::Driver::add_dyn_sink).
pub struct DynSink(pub(crate) Box<dyn ErasedSink>);

impl DynSink {
    /// Wraps `sink`, run with `delivery`.
    pub fn new<T: TwoPhaseCommit>(sink: T, delivery: DeliveryGuarantee) -> Self {
        match delivery {
            DeliveryGuarantee::ExactlyOnce => Self(Box::new(sink)),
            weaker => Self(Box::new(GuaranteedSink::new(sink, weaker))),
        }
    }

    /// The sink's id.
    pub fn sink_id(&self) -> &SinkId {
        self.0.sink_id()
    }
}

impl std::fmt::Debug for DynSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DynSink").field(self.sink_id()).finish()
    }
}

/// What a sink's read-only check found ([`SinkFactory::check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkCheck {
    /// What was checked and found, in one line.
    pub summary: String,
    /// The transaction timeout a sink of these settings and delivery would declare
    /// ([`TwoPhaseCommit::transaction_timeout`]), for the timeout budget.
    pub transaction_timeout: Option<std::time::Duration>,
}

/// One sink type, typed: its `type` in a job file, its settings, and how an instance is built and checked. The
/// blanket impl makes every builder a [`SinkFactory`]; implement this, not `SinkFactory`.
#[async_trait]
pub trait SinkBuilder: Send + Sync + 'static {
    /// The `type` in a job file.
    const KIND: &'static str;

    /// The sink's own settings: every key of its `[[sinks]]` entry other than `type`, `id`, `delivery`,
    /// `evolution` and `select` (`#[serde(deny_unknown_fields)]`, with a key | meaning | default table in its docs).
    type Settings: DeserializeOwned + Send + 'static;

    /// The columns a sink of these settings writes rows by (an upsert key): a change to them would make a row
    /// update or delete another row than the record's, so a transform in front of the sink must pass them
    /// through unchanged. None by default (the sink appends).
    fn key_columns(settings: &Self::Settings) -> Vec<String> {
        let _ = settings;
        Vec::new()
    }

    /// The longest building or checking a sink of `settings` may take when it is longer than the registry's setup
    /// timeout ([`SinkRegistry::with_setup_timeout`]): a sink whose calls have their own, longer bounds (an Iceberg
    /// `commit_timeout` raised for a slow catalog) says so here. None by default.
    fn setup_time(settings: &Self::Settings) -> Option<Duration> {
        let _ = settings;
        None
    }

    /// The columns of the batches (`context.schema`) that the sink's external system lacks now: what a sink with
    /// `evolution = "ignore"` leaves out (empty when it would create its table with every column). Read only.
    /// By default refused: only a sink that writes into a table whose columns it can read keeps them.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a sink type without a table, or settings that cannot work; whatever
    /// reaching the server reports.
    async fn lacking_columns(
        &self,
        settings: Self::Settings,
        context: SinkContext,
    ) -> Result<Vec<String>> {
        let _ = settings;
        Err(Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "evolution = \"ignore\" keeps the columns of a sink's table, and a {} sink has no table: it \
                 writes each batch's columns as they come. Use evolution = \"none\" (refuse new fields), \
                 \"add-columns\" or \"evolve\"",
                Self::KIND
            ),
        )
        .with_sink(&context.sink))
    }

    /// Completes the raw settings from the job before they are parsed, for defaults derived from the job (the
    /// Kafka sink's transactional-id prefix). Unchanged by default.
    fn complete_settings(settings: serde_json::Value, context: &SinkContext) -> serde_json::Value {
        let _ = context;
        settings
    }

    /// Builds one instance for `context`, run with `delivery`.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for settings that cannot work together; whatever connecting reports.
    async fn build_sink(
        &self,
        settings: Self::Settings,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<DynSink>;

    /// Checks, changing nothing anywhere, that a sink of these settings could run ([`SinkFactory::check`]).
    ///
    /// # Errors
    /// As [`SinkFactory::check`].
    async fn check_sink(
        &self,
        settings: Self::Settings,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<SinkCheck>;
}

#[async_trait]
impl<B: SinkBuilder> SinkFactory for B {
    fn kind(&self) -> &'static str {
        B::KIND
    }

    async fn build(
        &self,
        settings: serde_json::Value,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<DynSink> {
        let settings = B::complete_settings(settings, &context);
        let settings = parse_settings(&context.sink, B::KIND, settings)?;
        self.build_sink(settings, delivery, context).await
    }

    async fn check(
        &self,
        settings: serde_json::Value,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<SinkCheck> {
        let settings = B::complete_settings(settings, &context);
        let settings = parse_settings(&context.sink, B::KIND, settings)?;
        self.check_sink(settings, delivery, context).await
    }

    fn key_columns(
        &self,
        settings: serde_json::Value,
        context: &SinkContext,
    ) -> Result<Vec<String>> {
        let settings = B::complete_settings(settings, context);
        let settings: B::Settings = parse_settings(&context.sink, B::KIND, settings)?;
        Ok(B::key_columns(&settings))
    }

    fn setup_time(&self, settings: serde_json::Value, context: &SinkContext) -> Option<Duration> {
        let settings = B::complete_settings(settings, context);
        let settings: B::Settings = parse_settings(&context.sink, B::KIND, settings).ok()?;
        B::setup_time(&settings)
    }

    async fn lacking_columns(
        &self,
        settings: serde_json::Value,
        context: SinkContext,
    ) -> Result<Vec<String>> {
        let settings = B::complete_settings(settings, &context);
        let settings = parse_settings(&context.sink, B::KIND, settings)?;
        B::lacking_columns(self, settings, context).await
    }
}

/// Builds the sinks of one `type` from their settings, as JSON: what the [`SinkRegistry`] holds. Every
/// [`SinkBuilder`] is one.
#[async_trait]
pub trait SinkFactory: Send + Sync {
    /// The `type` in a job file.
    fn kind(&self) -> &'static str;

    /// Builds one instance for `context` from `settings` (the entry's keys other than `type`, `id`, `delivery`
    /// and `evolution`), run with `delivery`.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the key for settings that do not parse; whatever connecting reports.
    async fn build(
        &self,
        settings: serde_json::Value,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<DynSink>;

    /// Checks, changing nothing anywhere, that a sink of these settings could run: the settings parse, its server
    /// answers, and what it writes to exists (or would be created as configured). For `ratchet check-config`:
    /// builds no sink, opens no transaction, creates no table, directory, topic or registry entry.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the key or the missing table/topic/bucket; whatever reaching the server
    /// reports (named, with its address).
    async fn check(
        &self,
        settings: serde_json::Value,
        delivery: DeliveryGuarantee,
        context: SinkContext,
    ) -> Result<SinkCheck>;

    /// The columns a sink of `settings` writes rows by ([`SinkBuilder::key_columns`]).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the key for settings that do not parse.
    fn key_columns(
        &self,
        settings: serde_json::Value,
        context: &SinkContext,
    ) -> Result<Vec<String>>;

    /// The columns of the batches the sink's external system lacks ([`SinkBuilder::lacking_columns`]).
    ///
    /// # Errors
    /// As [`SinkBuilder::lacking_columns`].
    async fn lacking_columns(
        &self,
        settings: serde_json::Value,
        context: SinkContext,
    ) -> Result<Vec<String>>;

    /// A sink of `settings`' own bound on building or checking it ([`SinkBuilder::setup_time`]); None for
    /// settings that do not parse (building reports them).
    fn setup_time(&self, settings: serde_json::Value, context: &SinkContext) -> Option<Duration>;
}

/// Reads a sink's settings into its config type, refusing unknown keys with the sink named.
pub fn parse_settings<T: serde::de::DeserializeOwned>(
    sink: &SinkId,
    kind: &str,
    settings: serde_json::Value,
) -> Result<T> {
    serde_json::from_value(settings).map_err(|e| {
        Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "the settings of this {kind} sink are invalid: {}",
                connector_common::config::with_suggestion(&e.to_string())
            ),
        )
        .with_sink(sink)
    })
}

/// How long building or checking one sink may take by default ([`SinkRegistry::with_setup_timeout`]).
pub const DEFAULT_SETUP_TIMEOUT: Duration = Duration::from_secs(120);

/// The factories a job can use, by `type`.
pub struct SinkRegistry {
    factories: BTreeMap<&'static str, Box<dyn SinkFactory>>,
    setup_timeout: Duration,
}

impl Default for SinkRegistry {
    fn default() -> Self {
        Self {
            factories: BTreeMap::new(),
            setup_timeout: DEFAULT_SETUP_TIMEOUT,
        }
    }
}

impl SinkRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bounds building or checking one sink (its factory's connect, lookups and setup, and the lookup of the
    /// columns an `evolution = "ignore"` sink's table lacks) by `timeout`: a server that accepts the connection
    /// and then answers nothing fails the start (retryable, naming the sink) instead of hanging it.
    /// [`DEFAULT_SETUP_TIMEOUT`] unless set.
    pub fn with_setup_timeout(&mut self, timeout: Duration) -> &mut Self {
        self.setup_timeout = timeout;
        self
    }

    /// `work` (what `doing` says, for `spec`'s sink) within the setup timeout, or the sink's own longer one
    /// ([`SinkFactory::setup_time`]).
    async fn bounded<T>(
        &self,
        spec: &SinkSpec,
        own: Option<Duration>,
        doing: &str,
        work: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let limit = own.map_or(self.setup_timeout, |own| own.max(self.setup_timeout));
        match tokio::time::timeout(limit, work).await {
            Ok(done) => done.map_err(|e| e.or_sink(&spec.id)),
            Err(_) => Err(Error::new(
                ErrorKind::Retryable,
                Phase::Setup,
                format!(
                    "{doing} this {} sink did not finish within {limit:?}: its server accepts connections but \
                     does not answer; check the server and the network (a start retries)",
                    spec.kind
                ),
            )
            .with_sink(&spec.id)),
        }
    }

    /// Adds `factory` for its [`kind`](SinkFactory::kind); a later one for the same kind replaces it.
    pub fn register(&mut self, factory: impl SinkFactory + 'static) -> &mut Self {
        self.factories.insert(factory.kind(), Box::new(factory));
        self
    }

    /// The registered kinds.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.factories.keys().copied().collect()
    }

    /// Checks `spec` for `subtask` of `job` without building it or changing anything ([`SinkFactory::check`]).
    ///
    /// # Errors
    /// As [`build`](Self::build), and what the check finds.
    pub async fn check(
        &self,
        spec: &SinkSpec,
        job: Option<&JobId>,
        subtask: SubtaskId,
        schema: SchemaRef,
    ) -> Result<SinkCheck> {
        let (factory, context) = self.factory(spec, job, subtask, schema)?;
        let settings = serde_json::Value::Object(spec.settings.clone());
        let own = factory.setup_time(settings.clone(), &context);
        let checked = async {
            let (context, kept) = kept_columns(factory, &settings, context).await?;
            let check = factory.check(settings, spec.delivery, context).await?;
            Ok((check, kept))
        };
        let (mut check, kept) = self.bounded(spec, own, "checking", checked).await?;
        if let Some(kept) = kept.filter(|k| !k.left_out().is_empty()) {
            check.summary.push_str(&format!(
                "; leaves out column(s) {} (evolution = \"ignore\": the table lacks them)",
                kept.left_out().join(", ")
            ));
        }
        Ok(check)
    }

    /// The columns the sink of `spec` writes rows by (an upsert key; empty for a sink that appends), for the
    /// transforms in front of it ([`SinkBuilder::key_columns`]).
    ///
    /// # Errors
    /// As [`build`](Self::build) for an unknown type or invalid settings.
    pub fn key_columns(&self, spec: &SinkSpec, job: Option<&JobId>) -> Result<Vec<String>> {
        let schema = std::sync::Arc::new(arrow_schema::Schema::empty());
        let (factory, context) = self.factory(spec, job, SubtaskId(0), schema)?;
        factory
            .key_columns(serde_json::Value::Object(spec.settings.clone()), &context)
            .map_err(|e| e.or_sink(&spec.id))
    }

    fn factory(
        &self,
        spec: &SinkSpec,
        job: Option<&JobId>,
        subtask: SubtaskId,
        schema: SchemaRef,
    ) -> Result<(&dyn SinkFactory, SinkContext)> {
        let factory = self.factories.get(spec.kind.as_str()).ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!(
                    "unknown sink type {:?}; known types: {}",
                    spec.kind,
                    self.kinds().join(", ")
                ),
            )
            .with_sink(&spec.id)
        })?;
        let context = SinkContext {
            job: job.cloned(),
            sink: spec.id.clone(),
            subtask,
            schema,
            evolution: spec.evolution,
        };
        Ok((factory.as_ref(), context))
    }

    /// Builds the instance of `spec` for `subtask` of `job` ([`SinkContext::job`]), given batches of `schema`.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for an unknown `type` (naming the known ones) or invalid settings.
    pub async fn build(
        &self,
        spec: &SinkSpec,
        job: Option<&JobId>,
        subtask: SubtaskId,
        schema: SchemaRef,
    ) -> Result<DynSink> {
        let (factory, context) = self.factory(spec, job, subtask, schema)?;
        let settings = serde_json::Value::Object(spec.settings.clone());
        let own = factory.setup_time(settings.clone(), &context);
        let built = async {
            let (context, kept) = kept_columns(factory, &settings, context).await?;
            let sink = factory.build(settings, spec.delivery, context).await?;
            Ok(match kept {
                Some(kept) => DynSink(Box::new(IgnoringSink::new(sink.0, kept))),
                None => sink,
            })
        };
        self.bounded(spec, own, "building", built).await
    }
}

/// For a sink with `evolution = "ignore"`: the columns of `context`'s batches it keeps (the ones its table has),
/// and the context with their schema, what it is built or checked for. Other sinks: `context` as it is.
async fn kept_columns(
    factory: &dyn SinkFactory,
    settings: &serde_json::Value,
    context: SinkContext,
) -> Result<(SinkContext, Option<Kept>)> {
    if context.evolution != Evolution::Ignore {
        return Ok((context, None));
    }
    let lacking = factory
        .lacking_columns(settings.clone(), context.clone())
        .await?;
    let kept = Kept::without(context.schema.clone(), &lacking)?;
    let context = SinkContext {
        schema: kept.schema(),
        ..context
    };
    Ok((context, Some(kept)))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NothingSettings {
        size: u32,
    }

    #[async_trait]
    impl SinkBuilder for Nothing {
        const KIND: &'static str = "nothing";
        type Settings = NothingSettings;

        async fn build_sink(
            &self,
            settings: NothingSettings,
            _: DeliveryGuarantee,
            _: SinkContext,
        ) -> Result<DynSink> {
            Err(Error::bug(
                Phase::Setup,
                format!("parsed size {}", settings.size),
            ))
        }
        async fn check_sink(
            &self,
            _: NothingSettings,
            _: DeliveryGuarantee,
            _: SinkContext,
        ) -> Result<SinkCheck> {
            Ok(SinkCheck {
                summary: "nothing to check".into(),
                transaction_timeout: None,
            })
        }
    }

    /// A sink whose server accepts the connection and then answers nothing.
    struct Silent;

    #[async_trait]
    impl SinkBuilder for Silent {
        const KIND: &'static str = "silent";
        type Settings = NothingSettings;

        async fn lacking_columns(&self, _: NothingSettings, _: SinkContext) -> Result<Vec<String>> {
            std::future::pending().await
        }
        async fn build_sink(
            &self,
            _: NothingSettings,
            _: DeliveryGuarantee,
            _: SinkContext,
        ) -> Result<DynSink> {
            std::future::pending().await
        }
        async fn check_sink(
            &self,
            _: NothingSettings,
            _: DeliveryGuarantee,
            _: SinkContext,
        ) -> Result<SinkCheck> {
            std::future::pending().await
        }
    }

    /// A sink whose checks take longer than the registry's setup timeout, and that says so.
    struct Slow;

    #[async_trait]
    impl SinkBuilder for Slow {
        const KIND: &'static str = "slow";
        type Settings = NothingSettings;

        fn setup_time(settings: &NothingSettings) -> Option<Duration> {
            Some(Duration::from_secs(u64::from(settings.size)))
        }
        async fn build_sink(
            &self,
            _: NothingSettings,
            _: DeliveryGuarantee,
            _: SinkContext,
        ) -> Result<DynSink> {
            std::future::pending().await
        }
        async fn check_sink(
            &self,
            _: NothingSettings,
            _: DeliveryGuarantee,
            _: SinkContext,
        ) -> Result<SinkCheck> {
            tokio::time::sleep(Duration::from_millis(600)).await;
            Ok(SinkCheck {
                summary: "slow but fine".into(),
                transaction_timeout: None,
            })
        }
    }

    fn spec(toml_text: &str) -> SinkSpec {
        toml::from_str(toml_text).unwrap()
    }

    #[tokio::test]
    async fn unknown_types_and_keys_are_refused_naming_the_sink() {
        let mut registry = SinkRegistry::new();
        registry.register(Nothing);
        let schema = std::sync::Arc::new(arrow_schema::Schema::empty());

        let err = registry
            .build(
                &spec("type = \"nope\"\nid = \"s\""),
                None,
                SubtaskId(0),
                schema.clone(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.to_string().contains("known types: nothing"), "{err}");

        let err = registry
            .build(
                &spec("type = \"nothing\"\nid = \"s\"\nsise = 3"),
                None,
                SubtaskId(0),
                schema.clone(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(
            err.to_string().contains("sink s")
                && err.to_string().contains("sise")
                && err.to_string().contains("did you mean `size`?"),
            "{err}"
        );

        let parsed = spec("type = \"nothing\"\nid = \"s\"\ndelivery = \"at-least-once\"\nsize = 3");
        assert_eq!(parsed.delivery, DeliveryGuarantee::AtLeastOnce);
        let err = registry
            .build(&parsed, None, SubtaskId(0), schema)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Bug, "{err}");
        assert!(err.to_string().contains("parsed size 3"), "{err}");
    }

    #[tokio::test]
    async fn ignore_on_a_sink_without_a_table_is_refused_naming_the_other_modes() {
        let mut registry = SinkRegistry::new();
        registry.register(Nothing);
        let schema = std::sync::Arc::new(arrow_schema::Schema::empty());
        let parsed = spec("type = \"nothing\"\nid = \"s\"\nevolution = \"ignore\"\nsize = 3");
        assert_eq!(parsed.evolution, Evolution::Ignore);
        let check = registry
            .check(&parsed, None, SubtaskId(0), schema.clone())
            .await
            .unwrap_err();
        let build = registry
            .build(&parsed, None, SubtaskId(0), schema)
            .await
            .unwrap_err();
        for err in [check, build] {
            assert_eq!(err.kind(), ErrorKind::Config);
            let text = err.to_string();
            assert!(
                text.contains("sink s")
                    && text.contains("a nothing sink has no table")
                    && text.contains("\"add-columns\""),
                "{text}"
            );
        }
    }

    #[tokio::test]
    async fn a_sink_whose_server_never_answers_fails_its_build_and_check_within_the_setup_timeout()
    {
        let mut registry = SinkRegistry::new();
        registry
            .register(Silent)
            .with_setup_timeout(Duration::from_millis(300));
        let schema = std::sync::Arc::new(arrow_schema::Schema::empty());
        for evolution in ["none", "ignore"] {
            let parsed = spec(&format!(
                "type = \"silent\"\nid = \"s\"\nevolution = \"{evolution}\"\nsize = 3"
            ));
            let started = std::time::Instant::now();
            let check = registry
                .check(&parsed, None, SubtaskId(0), schema.clone())
                .await
                .unwrap_err();
            let build = registry
                .build(&parsed, None, SubtaskId(0), schema.clone())
                .await
                .unwrap_err();
            let waited = started.elapsed();
            assert!(
                waited >= Duration::from_millis(600) && waited < Duration::from_secs(10),
                "{waited:?}"
            );
            for (err, doing) in [(check, "checking"), (build, "building")] {
                assert_eq!(err.kind(), ErrorKind::Retryable, "{err}");
                let text = err.to_string();
                assert!(
                    text.contains("sink s")
                        && text.contains(&format!("{doing} this silent sink"))
                        && text.contains("within 300ms"),
                    "{text}"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_sink_s_own_longer_setup_time_raises_the_bound() {
        let mut registry = SinkRegistry::new();
        registry
            .register(Slow)
            .with_setup_timeout(Duration::from_millis(300));
        let schema = std::sync::Arc::new(arrow_schema::Schema::empty());
        let check = registry
            .check(
                &spec("type = \"slow\"\nid = \"s\"\nsize = 5"),
                None,
                SubtaskId(0),
                schema.clone(),
            )
            .await
            .unwrap();
        assert_eq!(check.summary, "slow but fine");
        // Its bound still holds: building never finishes, and fails at the sink's own 1 s.
        let started = std::time::Instant::now();
        let err = registry
            .build(
                &spec("type = \"slow\"\nid = \"s\"\nsize = 1"),
                None,
                SubtaskId(0),
                schema,
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("within 1s"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn an_ignoring_sink_lets_the_source_follow_new_fields_only() {
        assert_eq!(Evolution::Ignore.source_follows(), Evolution::AddColumns);
        assert!(!Evolution::Ignore.adds_columns() && !Evolution::Ignore.changes_columns());
        let job = [Evolution::Ignore, Evolution::Evolve]
            .map(Evolution::source_follows)
            .into_iter()
            .min();
        assert_eq!(job, Some(Evolution::AddColumns));
    }
}
