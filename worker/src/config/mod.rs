//! The job file of `ratchet run` and `ratchet check-config`: TOML, every section refusing unknown keys (with the
//! nearest valid key suggested), secrets and other values overridable from the environment
//! ([`crate::config::overrides`]). The full reference is `docs/worker.md`.
//!
//! ```toml
//! [job]
//! name = "orders"              # scopes the checkpoint records, leases and everything the sinks own
//! subtasks = 3                 # subtask i reads the partitions p with p % subtasks == i (changed by a rescale)
//! checkpoint_interval = "1s"
//!
//! [source]
//! bootstrap_servers = "127.0.0.1:19092"
//! topic = "orders"
//! decoding = { kind = "json", fields = [ { name = "order_id", type = "int64", nullable = false } ] }
//!
//! [store]
//! kind = "postgres"            # or "local" (the default: one process)
//! url = "postgresql://ratchet@127.0.0.1:15432/ratchet"
//!
//! [[sinks]]
//! type = "file"
//! id = "archive"
//! storage = { kind = "local", path = "/data/orders" }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use arrow_schema::SchemaRef;
use connector_api::{DriverConfig, SinkSpec};
use connector_common::config::with_suggestion;
use kafka_source::{
    Decoding, KafkaConnection, KafkaSourceOptions, KafkaSourceSettings, MetadataColumns,
    PartitionShare,
};
use serde::Deserialize;

/// How long the source's Kafka cluster may take to answer at start (`run`, `check-config`, waiting for a change
/// stream's topic) before the job stops naming it.
pub const KAFKA_REACHABLE_WITHIN: std::time::Duration = std::time::Duration::from_secs(15);

mod kafka_to_kafka;
pub mod overrides;
pub mod routed;
mod written;

/// The sink id the dead-letter topic's sink runs under ([`crate::job::dead_letter`]); no `[[sinks]]` entry may take it.
pub const DEAD_LETTER_SINK_ID: &str = "dead-letter";

pub use written::refuse_reading_written;

/// A whole job file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// Name, subtasks, timing.
    pub job: JobSection,
    /// The Kafka topic read.
    pub source: KafkaSourceSettings,
    /// Where checkpoint records live (a local directory when absent).
    #[serde(default)]
    pub store: StoreConfig,
    /// Where the records go: every sink gets every record.
    pub sinks: Vec<SinkSpec>,
    /// Where records that cannot be decoded or written go instead of stopping the job (absent: they stop it).
    #[serde(default)]
    pub dead_letter: Option<DeadLetterConfig>,
    /// SQL applied to every batch before the sinks, in order ([`crate::job::shaping`]).
    #[serde(default)]
    pub transforms: Vec<TransformConfig>,
}

/// One `[[transforms]]` entry: a stateless `SELECT ... FROM input` over every batch.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformConfig {
    /// Its name in errors, dead letters and `check-config` (default `transform-<n>`, counted from 1).
    #[serde(default)]
    pub name: Option<String>,
    /// The query; `input` is the previous transform's output (the source's rows for the first).
    pub sql: String,
}

/// The source's partition column when the job shapes its rows and `[source.metadata]` does not add one: kept out
/// of the transforms' `input`, it names a failing row's record in its dead letter.
pub const HIDDEN_PARTITION: &str = "__ratchet_partition";
/// The source's offset column, as [`HIDDEN_PARTITION`].
pub const HIDDEN_OFFSET: &str = "__ratchet_offset";

/// `[dead_letter]`: a Kafka topic on the source's cluster ([`crate::job::dead_letter`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterConfig {
    /// The topic.
    pub topic: String,
    /// Transactional-id prefix of its producers (default `<job>-dead-letter`).
    #[serde(default)]
    pub transactional_id_prefix: Option<String>,
}

/// `[job]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    /// The job's name: checkpoint records and leases are kept under it; letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// How many subtasks the job has (each owns a share of the partitions and its own checkpoint records; a
    /// change is a rescale, [`crate::job::rescale`]).
    #[serde(default = "one")]
    pub subtasks: u32,
    /// How often each subtask checkpoints (when it wrote something since the last checkpoint).
    #[serde(default = "ten_seconds", with = "humantime_serde")]
    pub checkpoint_interval: Duration,
    /// How long a process's claim on a subtask lasts without renewal (PostgreSQL store): a killed or paused
    /// process's subtasks are taken over by another process within about this long plus one renewal period.
    #[serde(default = "ten_seconds", with = "humantime_serde")]
    pub lease: Duration,
    /// How processes share the job's subtasks ([`MembershipConfig`]).
    #[serde(default)]
    pub membership: MembershipConfig,
    /// A subtask that fails is restarted (recovering from its checkpoint) this many times in a row with a
    /// warning, then the job stops with the error.
    #[serde(default = "five")]
    pub max_restarts: u32,
    /// The longest a crashed job may take to be restarted (for the sinks' transaction-timeout budget).
    #[serde(default = "one_minute", with = "humantime_serde")]
    pub max_restart_time: Duration,
    /// The longest one call to the checkpoint store may take before it fails by itself (enforced: a PostgreSQL
    /// store's call that takes longer fails and its connection is discarded), and the per-call term of the
    /// timeout budget.
    #[serde(default = "fifteen_seconds", with = "humantime_serde")]
    pub max_call_time: Duration,
    /// The longest recovery may take (a budget term); with a PostgreSQL store also how long the server keeps an
    /// orphaned claim guard (a process that went silent while recovering) before ending its session.
    #[serde(default = "one_minute", with = "humantime_serde")]
    pub max_recovery_time: Duration,
    /// Copy Kafka to Kafka with the source offsets inside each transaction ([`crate::cmd::fast_path`]): one exactly-once
    /// Kafka sink on the source's cluster, one subtask, no checkpoint store.
    #[serde(default)]
    pub kafka_to_kafka: bool,
}

/// `[job] membership`: which process runs which subtask. Safety is the checkpoint store's claims in every mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MembershipConfig {
    /// Leases in the PostgreSQL store ([`crate::membership::leases`]), or with `--member i --of M`, static shares
    /// ([`crate::membership::static_share`]).
    #[default]
    Leases,
    /// Kafka's group protocol on a coordination topic ([`crate::membership::kafka_group`]).
    KafkaGroup,
}

fn one() -> u32 {
    1
}
fn five() -> u32 {
    5
}
fn ten_seconds() -> Duration {
    Duration::from_secs(10)
}
fn fifteen_seconds() -> Duration {
    Duration::from_secs(15)
}
fn one_minute() -> Duration {
    Duration::from_secs(60)
}

/// `[store]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum StoreConfig {
    /// A directory on this machine (`<path>/subtask-<n>`): one process runs every subtask.
    Local {
        /// The directory.
        #[serde(default = "default_state_dir")]
        path: PathBuf,
    },
    /// PostgreSQL tables shared by every process of the job: the only store that scales out.
    Postgres {
        /// libpq URL; the password from the URL, `PGPASSWORD`, or an override
        /// (`RATCHET__STORE__URL`).
        url: String,
    },
}

fn default_state_dir() -> PathBuf {
    PathBuf::from(".ratchet/state")
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self::Local {
            path: default_state_dir(),
        }
    }
}

impl JobConfig {
    /// Reads `path`, applies the `RATCHET__...` overrides from the environment, and checks what can be checked
    /// without connecting anywhere.
    ///
    /// # Errors
    /// The file and, for a key that does not parse, its line and the nearest valid key.
    #[allow(clippy::disallowed_methods)] // the job file's `RATCHET__` overrides come from the environment
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the job file {}", path.display()))?;
        Self::parse(&text, std::env::vars())
            .with_context(|| format!("job file {} is invalid", path.display()))
    }

    /// Parses job-file `text` with the overrides among `env`.
    ///
    /// # Errors
    /// As [`load`](Self::load).
    pub fn parse(text: &str, env: impl IntoIterator<Item = (String, String)>) -> Result<Self> {
        let explain = |e: toml::de::Error| anyhow::anyhow!("{}", with_suggestion(&e.to_string()));
        let mut table: toml::Table = toml::from_str(text).map_err(explain)?;
        let config: Self = if crate::config::overrides::apply(&mut table, env)? == 0 {
            // From the text, so that an error names its line.
            toml::from_str(text).map_err(explain)?
        } else {
            table.try_into().map_err(explain)?
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        let name = &self.job.name;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            bail!(
                "[job] name {name:?} must be non-empty and use only letters, digits, '-', '_' and '.': it names \
                 the checkpoint records and everything the sinks own"
            );
        }
        self.selection()?;
        if self.job.subtasks == 0 || self.job.subtasks > 1024 {
            bail!(
                "[job] subtasks = {} is out of range: use 1 to 1024 (usually the topic's partition count or a divisor of it)",
                self.job.subtasks
            );
        }
        if self.job.checkpoint_interval < Duration::from_millis(100) {
            bail!("[job] checkpoint_interval must be at least 100ms");
        }
        if self.job.lease < Duration::from_secs(2) {
            bail!("[job] lease must be at least 2s (it is renewed every lease/5)");
        }
        if self.job.max_call_time < Duration::from_secs(1) {
            bail!(
                "[job] max_call_time must be at least 1s (every checkpoint store call, and a sink's pre_commit, is \
                 abandoned after it)"
            );
        }
        if self.job.max_recovery_time < Duration::from_secs(2) {
            bail!(
                "[job] max_recovery_time must be at least 2s (recovery is stopped after it, and an idle claim \
                 guard ended by the server)"
            );
        }
        if self.sinks.is_empty() {
            bail!("the job has no [[sinks]]: add at least one");
        }
        if self.source.metadata_refresh < Duration::from_secs(1)
            || self.source.metadata_refresh > Duration::from_secs(30)
        {
            bail!(
                "[source] metadata_refresh = {:?} is out of range: use 1s to 30s",
                self.source.metadata_refresh
            );
        }
        // Decodings that need no registry are checked here; a registry's are checked when first resolved.
        if let Some((decoding, metadata)) = self.source.offline_decodings()? {
            metadata.schema(&decoding).context("[source] metadata")?;
        }
        crate::config::routed::check(&self.sinks)?;
        if self.job.kafka_to_kafka {
            self.check_kafka_to_kafka()?;
        }
        if let Some(sink) = self
            .sinks
            .iter()
            .find(|s| s.id.as_str() == DEAD_LETTER_SINK_ID)
        {
            bail!(
                "sink id {:?} is reserved for the dead-letter topic: rename that [[sinks]] entry",
                sink.id.to_string()
            );
        }
        Ok(())
    }

    /// The consumer group decided positions are committed to for lag ([`crate::ops::lag`]): `[source] lag_group`, by
    /// default `ratchet.<job>`; `None` when set to `""`.
    pub fn lag_group(&self) -> Option<String> {
        match self.source.lag_group.as_deref() {
            None => Some(format!("ratchet.{}", self.job.name)),
            Some("") => None,
            Some(group) => Some(group.to_string()),
        }
    }

    /// The source's Kafka connection.
    ///
    /// # Errors
    /// A connection setting that cannot be honoured, named.
    pub fn kafka(&self) -> Result<KafkaConnection> {
        Ok(self.source.connection()?)
    }

    /// How the source decodes records, the record metadata it adds as columns, and the schema of the batches:
    /// a schema registry's reader schemas looked up now. Resolved once per process (`run` keeps it for every
    /// subtask, so all of them and every sink see the same columns) or per command.
    ///
    /// # Errors
    /// A decoding or metadata setting that is wrong, named; a registry subject without schemas, or a registry
    /// that cannot be reached (after retries); a metadata column named like a decoded column.
    pub async fn resolve_source(&self) -> Result<SourceSetup> {
        let (decoding, mut metadata) = self.source.decodings(self.evolution()).await?;
        let mut hidden = Vec::new();
        if self.shapes_rows() {
            for (column, name) in [
                (&mut metadata.partition, HIDDEN_PARTITION),
                (&mut metadata.offset, HIDDEN_OFFSET),
            ] {
                if column.is_none() {
                    *column = Some(name.to_string());
                    hidden.push(name.to_string());
                }
            }
        }
        let schema = metadata.schema(&decoding).context("[source] metadata")?;
        Ok(SourceSetup {
            decoding,
            metadata,
            schema,
            hidden,
        })
    }

    /// Whether the job has transforms or a sink with a `select` ([`crate::job::shaping`]).
    pub fn shapes_rows(&self) -> bool {
        !self.transforms.is_empty() || self.sinks.iter().any(|s| s.select.is_some())
    }

    /// How far the job follows the source's schema: as far as its least evolving sink (a sink that does not take
    /// a change would refuse it, so the records are refused at the source instead, named; an `ignore` sink takes
    /// new fields by leaving them out). `none` without sinks.
    pub fn evolution(&self) -> connector_api::Evolution {
        self.sinks
            .iter()
            .map(|s| s.evolution.source_follows())
            .min()
            .unwrap_or_default()
    }

    /// The driver configuration of every subtask.
    pub fn driver_config(&self) -> DriverConfig {
        DriverConfig {
            checkpoint_interval: self.job.checkpoint_interval,
            max_restart_time: self.job.max_restart_time,
            max_call_time: self.job.max_call_time,
            max_recovery_time: self.job.max_recovery_time,
            takeover_time: self.takeover_time(),
            ..DriverConfig::default()
        }
    }

    /// How long other processes take to pick up a subtask of a process that went silent: with a PostgreSQL store,
    /// its lease expires (`lease`), the others notice at their next renewal (`lease / 5`), and a claim waits for its
    /// orphaned claim guard, which the server ends after `max_recovery_time`. Zero with a local store (one process;
    /// its restart is `max_restart_time`).
    pub fn takeover_time(&self) -> Duration {
        match self.store {
            StoreConfig::Local { .. } => Duration::ZERO,
            StoreConfig::Postgres { .. } => {
                self.job.lease + self.job.lease / 5 + self.job.max_recovery_time
            }
        }
    }

    /// The limits of a PostgreSQL checkpoint store's calls and sessions: each call within the driver's
    /// `max_call_time` (a claim waits for a held lock in rounds of it, logging the holder after each), and an
    /// orphaned claim guard ended by the server after `max_recovery_time` (recovery checks its claim more often
    /// than that).
    pub fn store_limits(&self) -> checkpoint_postgres::PgStoreLimits {
        let driver = self.driver_config();
        checkpoint_postgres::PgStoreLimits {
            call: driver.max_call_time,
            claim_round: driver.max_call_time,
            guard_idle: driver.max_recovery_time,
        }
    }
}

/// The source resolved for a run ([`JobConfig::resolve_source`]): decodings, metadata columns, and the schema of
/// every batch the sinks receive.
#[derive(Debug, Clone)]
pub struct SourceSetup {
    /// How values (and keys) become columns.
    pub decoding: Decoding,
    /// The record metadata added as columns.
    pub metadata: MetadataColumns,
    /// The decoding's columns, then the metadata columns.
    pub schema: SchemaRef,
    /// Metadata columns added only to name a failing row's record ([`HIDDEN_PARTITION`], [`HIDDEN_OFFSET`]):
    /// not in the transforms' `input`, never written.
    pub hidden: Vec<String>,
}

impl SourceSetup {
    /// The reader's options for subtask `share` of `job`, diverting bad records when `divert` (the job has a
    /// dead-letter topic).
    pub fn options(
        &self,
        job: &JobConfig,
        share: PartitionShare,
        divert: bool,
    ) -> KafkaSourceOptions {
        let mut options = job
            .source
            .options(self.decoding.clone(), self.metadata.clone());
        options.share = Some(share);
        options.divert_bad_records = divert;
        options
    }
}

/// A job-file problem found while a subtask runs (a selection or schema the registry resolves), as the driver's
/// [`Config`](connector_api::ErrorKind::Config) error: it stops the job, since a restart would meet it again.
pub fn config_error(e: anyhow::Error) -> connector_api::Error {
    connector_api::Error::new(
        connector_api::ErrorKind::Config,
        connector_api::Phase::Setup,
        format!("{e:#}"),
    )
}

#[cfg(test)]
mod tests {
    use arrow_schema::DataType;

    use super::*;

    const MINIMAL: &str = r#"
[job]
name = "orders"
subtasks = 3
checkpoint_interval = "1s"

[source]
bootstrap_servers = "127.0.0.1:19092"
topic = "orders"
decoding = { kind = "json", fields = [ { name = "id", type = "int64", nullable = false } ] }

[store]
kind = "postgres"
url = "postgresql://ratchet@127.0.0.1:15432/ratchet"

[[sinks]]
type = "file"
id = "archive"
storage = { kind = "local", path = "/tmp/x" }
"#;

    fn no_env() -> Vec<(String, String)> {
        Vec::new()
    }

    #[test]
    fn the_source_names_its_topics_one_way_only() {
        let with = |line: &str| MINIMAL.replace("topic = \"orders\"", line);
        let list =
            JobConfig::parse(&with("topics = [\"orders-eu\", \"orders-us\"]"), no_env()).unwrap();
        assert_eq!(
            list.source.selection().unwrap().to_string(),
            "topics orders-eu, orders-us"
        );
        assert_eq!(list.source.single_topic(), None);
        let pattern = JobConfig::parse(&with("topic_pattern = \"orders-.*\""), no_env()).unwrap();
        assert!(pattern.source.selection().unwrap().selects("orders-apac"));
        for (line, says) in [
            ("topics = []", "topics is empty"),
            ("topics = [\"a\", \"a\"]", "names \"a\" twice"),
            ("topic_pattern = \"orders-(\"", "topic_pattern"),
            ("topic = \"a\"\ntopics = [\"b\"]", "exactly one of topic"),
            ("", "exactly one of topic"),
        ] {
            let error = format!("{:#}", JobConfig::parse(&with(line), no_env()).unwrap_err());
            assert!(error.contains(says), "{line}: {error}");
        }
    }

    #[test]
    fn a_complete_file_parses() {
        let job = JobConfig::parse(MINIMAL, no_env()).unwrap();
        assert_eq!(job.job.subtasks, 3);
        assert_eq!(job.job.checkpoint_interval, Duration::from_secs(1));
        assert_eq!(job.job.lease, Duration::from_secs(10));
        assert!(matches!(job.store, StoreConfig::Postgres { .. }));
        let (decoding, metadata) = job.source.offline_decodings().unwrap().unwrap();
        let schema = metadata.schema(&decoding).unwrap();
        assert_eq!(schema.field(0).data_type(), &DataType::Int64);
        assert!(!schema.field(0).is_nullable());
    }

    #[test]
    fn a_misspelt_key_names_the_line_and_the_nearest_key() {
        let text = MINIMAL.replace("checkpoint_interval", "checkpoint_intervall");
        let err = format!("{:#}", JobConfig::parse(&text, no_env()).unwrap_err());
        assert!(err.contains("line 5"), "{err}");
        assert!(err.contains("did you mean `checkpoint_interval`?"), "{err}");
        let text = MINIMAL.replace("type = \"int64\"", "type = \"int46\"");
        let err = format!("{:#}", JobConfig::parse(&text, no_env()).unwrap_err());
        assert!(err.contains("int46") && err.contains("int64"), "{err}");
    }

    #[test]
    fn the_fast_path_is_refused_where_it_cannot_copy_exactly_once() {
        let text = MINIMAL.replace("subtasks = 3", "subtasks = 3\nkafka_to_kafka = true");
        let err = format!("{:#}", JobConfig::parse(&text, no_env()).unwrap_err());
        assert!(
            err.contains("kafka_to_kafka") && err.contains("exactly-once Kafka sink"),
            "{err}"
        );
    }

    #[test]
    fn the_job_file_in_docs_worker_md_parses() {
        let doc = include_str!("../../../docs/worker.md");
        let example = doc
            .split("```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("docs/worker.md opens with a TOML example");
        let job = JobConfig::parse(example, no_env()).unwrap();
        assert_eq!(job.job.name, "orders");
        assert!(job.dead_letter.is_some());
        let avro = doc
            .split("```toml\n")
            .find(|block| block.starts_with("decoding = { kind = \"avro\""))
            .and_then(|block| block.split("```").next())
            .expect("docs/worker.md shows an Avro decoding");
        let text = MINIMAL.replace(
            "decoding = { kind = \"json\", fields = [ { name = \"id\", type = \"int64\", nullable = false } ] }",
            avro.trim(),
        );
        let job = JobConfig::parse(&text, no_env()).unwrap();
        let (decoding, _) = job.source.offline_decodings().unwrap().unwrap();
        assert_eq!(decoding.schema().field(0).name(), "id");

        // The registry example: its [source] keys in a complete job file make a registry client.
        let registry = doc
            .split("```toml\n")
            .find(|block| block.starts_with("[source]\ndecoding = { kind = \"avro\" }"))
            .and_then(|block| block.split("```").next())
            .expect("docs/worker.md shows a registry-backed Avro decoding");
        let (decoding, registry) = registry
            .trim_start_matches("[source]\n")
            .split_once("\n")
            .unwrap();
        let text = MINIMAL.replace(
            "decoding = { kind = \"json\", fields = [ { name = \"id\", type = \"int64\", nullable = false } ] }",
            decoding,
        ) + registry;
        let job = JobConfig::parse(&text, no_env()).unwrap();
        assert!(job.source.schema_registry().unwrap().is_some());
    }

    #[test]
    fn bad_values_are_refused_with_what_to_do() {
        let err = JobConfig::parse(&MINIMAL.replace("subtasks = 3", "subtasks = 0"), no_env())
            .unwrap_err()
            .to_string();
        assert!(err.contains("subtasks = 0"), "{err}");
        let err = JobConfig::parse(
            &MINIMAL.replace("\"orders\"\nsub", "\"a b\"\nsub"),
            no_env(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("name \"a b\""), "{err}");
        let err = JobConfig::parse(
            &MINIMAL.replace("subtasks = 3", "subtasks = 3\nmax_call_time = \"0s\""),
            no_env(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("max_call_time must be at least 1s"), "{err}");
    }

    #[test]
    fn the_store_limits_and_the_take_over_follow_the_job() {
        let text = MINIMAL.replace(
            "subtasks = 3",
            "subtasks = 3\nmax_call_time = \"4s\"\nmax_recovery_time = \"20s\"",
        );
        let job = JobConfig::parse(&text, no_env()).unwrap();
        let limits = job.store_limits();
        assert_eq!(limits.call, Duration::from_secs(4));
        assert_eq!(limits.claim_round, Duration::from_secs(4));
        assert_eq!(limits.guard_idle, Duration::from_secs(20));
        // PostgreSQL store: lease 10 s + a renewal period + the orphaned guard.
        assert_eq!(job.takeover_time(), Duration::from_secs(32));
        assert_eq!(job.driver_config().takeover_time, Duration::from_secs(32));
    }
}
