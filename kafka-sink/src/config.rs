//! Configuration of the Kafka sink.

use std::collections::BTreeMap;
use std::time::Duration;

use connector_api::{Error, ErrorKind, Phase, Result};
use rdkafka::ClientConfig;
use serde::Deserialize;

use kafka_connection::{KafkaConnection, redacted};

use crate::{RecordMapping, TransactionalId, TransactionalIdPool};

/// librdkafka keys the sink sets itself; setting them in `client` is refused.
const CONTROLLED_KEYS: &[&str] = &[
    "bootstrap.servers",
    "transactional.id",
    "enable.idempotence",
    "acks",
    "transaction.timeout.ms",
];

/// Kafka sink configuration.
///
/// | key | meaning | default |
/// |---|---|---|
/// | `bootstrap_servers` | Kafka bootstrap servers | required |
/// | `topic` | target topic | required |
/// | `transactional_id_prefix` | prefix of this sink's transactional ids; unique per job and sink | in a job file: `<job>~<sink id>` (required for jobs first run before job scoping, and for sinks built without a job) |
/// | `transactional_id_pool_size` | transactional ids per subtask (2 to 16: checkpoint N commits while N+1 is written) | 2 |
/// | `transaction_timeout` | `transaction.timeout.ms`: the broker aborts a transaction older than this | 10 min |
/// | `job` | the job's name: with the sink id, the owner of the prefix in the prefix registry | in a job file: the job's name (none for jobs first run before job scoping: the sink id alone) |
/// | `client` | other librdkafka producer settings, passed through (values of keys naming a password or secret are redacted in `Debug`) | none |
/// | `client_env` | librdkafka settings read from environment variables at start, `{ "sasl.password" = "KAFKA_PASSWORD" }` | none |
/// | `records` | how rows become records ([`RecordMapping`]) | the row as a JSON value, no key |
/// | `registry` | the schema registry Avro, JSON Schema and Protobuf values are registered in (`records.value_format = "avro"`, `"json-schema"` or `"protobuf"`; keys as `[source.registry]`: `schema_registry::RegistrySettings`) | none |
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// Kafka bootstrap servers.
    pub bootstrap_servers: String,
    /// The topic records go to.
    pub topic: String,
    /// Prefix of the transactional ids; two jobs or sinks must never share one.
    pub transactional_id_prefix: String,
    /// Transactional ids per subtask.
    #[serde(default = "default_pool_size")]
    pub transactional_id_pool_size: u32,
    /// How long the broker lets a transaction stay open before aborting it.
    #[serde(default = "default_transaction_timeout", with = "humantime_serde")]
    pub transaction_timeout: Duration,
    /// The job's name; `<job>/<sink id>` owns the prefix in the prefix registry, so two jobs configured with the
    /// same prefix are told apart (set it when sink ids can repeat across jobs).
    #[serde(default)]
    pub job: Option<String>,
    /// Other librdkafka producer settings (e.g. `compression.type`, `linger.ms`).
    #[serde(default)]
    pub client: BTreeMap<String, String>,
    /// librdkafka settings whose values are read from environment variables when the sink is built (setting →
    /// variable name), so that secrets such as `sasl.password` stay out of job files.
    #[serde(default)]
    pub client_env: BTreeMap<String, String>,
    /// How rows become records.
    #[serde(default)]
    pub records: RecordMapping,
    /// The schema registry values are registered in (`records.value_format = "avro"`, `"json-schema"` or
    /// `"protobuf"`).
    #[serde(default)]
    pub registry: Option<schema_registry::RegistrySettings>,
}

impl std::fmt::Debug for KafkaSinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let client = redacted(&self.client);
        f.debug_struct("KafkaSinkConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("topic", &self.topic)
            .field("transactional_id_prefix", &self.transactional_id_prefix)
            .field(
                "transactional_id_pool_size",
                &self.transactional_id_pool_size,
            )
            .field("transaction_timeout", &self.transaction_timeout)
            .field("job", &self.job)
            .field("client", &client)
            .field("client_env", &self.client_env)
            .field("records", &self.records)
            .field("registry", &self.registry)
            .finish()
    }
}

fn default_pool_size() -> u32 {
    2
}

fn default_transaction_timeout() -> Duration {
    Duration::from_secs(600)
}

impl KafkaSinkConfig {
    /// A config with defaults for everything optional.
    pub fn new(
        bootstrap_servers: impl Into<String>,
        topic: impl Into<String>,
        transactional_id_prefix: impl Into<String>,
    ) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            topic: topic.into(),
            transactional_id_prefix: transactional_id_prefix.into(),
            transactional_id_pool_size: default_pool_size(),
            transaction_timeout: default_transaction_timeout(),
            job: None,
            client: BTreeMap::new(),
            client_env: BTreeMap::new(),
            records: RecordMapping::default(),
            registry: None,
        }
    }

    /// The largest record the producer accepts: `message.max.bytes` from `client`, or librdkafka's default.
    pub fn max_message_bytes(&self) -> usize {
        self.client
            .get("message.max.bytes")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000)
    }

    /// The transactional-id pool this config describes.
    pub fn id_pool(&self) -> Result<TransactionalIdPool> {
        TransactionalIdPool::new(
            &self.transactional_id_prefix,
            self.transactional_id_pool_size,
        )
    }

    /// How every client of this sink reaches the cluster: the bootstrap servers and the connection settings of
    /// `client` (security, sockets), for librdkafka and for the protocol-level client alike. Reads the TLS files.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the setting or file that cannot be honoured (see [`KafkaConnection`]).
    pub fn kafka_connection(&self) -> Result<KafkaConnection> {
        KafkaConnection::new(&self.bootstrap_servers, &self.client)
    }

    /// Moves the `client_env` settings into `client`, reading each variable now.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the setting and the variable when the variable is not set, or when
    /// `client` sets the same key.
    pub fn resolve_env(mut self) -> Result<Self> {
        for (key, variable) in std::mem::take(&mut self.client_env) {
            let config_error =
                |message: String| Error::new(ErrorKind::Config, Phase::Setup, message);
            if self.client.contains_key(&key) {
                return Err(config_error(format!(
                    "client setting {key:?} is set both in `client` and in `client_env`; keep one"
                )));
            }
            #[allow(clippy::disallowed_methods)] // `client_env` names the variable to read
            let value = std::env::var(&variable).map_err(|_| {
                config_error(format!(
                    "client_env reads {key:?} from the environment variable {variable}, which is not set (or not \
                     UTF-8)"
                ))
            })?;
            self.client.insert(key, value);
        }
        Ok(self)
    }

    /// Refuses settings the sink cannot honour: connection settings not every client can follow (see
    /// [`KafkaConnection::new`]), an invalid transactional-id prefix or pool size.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the setting.
    pub fn validate(&self) -> Result<()> {
        self.kafka_connection()?;
        self.id_pool()?;
        self.records.check_format(self.registry.is_some())
    }

    /// librdkafka settings of a producer without transactions: idempotent, `acks=all`, every `client` setting.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when `client` sets a key the sink controls.
    pub fn idempotent_producer_config(&self) -> Result<ClientConfig> {
        if let Some(key) = self
            .client
            .keys()
            .find(|k| CONTROLLED_KEYS.contains(&k.as_str()))
        {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!(
                    "client setting {key:?} is controlled by the Kafka sink and cannot be overridden; remove it \
                     (sink settings: bootstrap_servers, transactional_id_prefix, transaction_timeout)"
                ),
            ));
        }
        let mut config = ClientConfig::new();
        for (key, value) in &self.client {
            config.set(key, value);
        }
        config
            .set("bootstrap.servers", &self.bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("acks", "all");
        Ok(config)
    }

    /// librdkafka settings for the producer of transactional id `id`: idempotent, `acks=all`, transactional.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for a controlled key in `client` or a `transaction_timeout` out of range.
    pub fn producer_config(&self, id: &TransactionalId) -> Result<ClientConfig> {
        let mut config = self.idempotent_producer_config()?;
        let timeout_ms = self.transaction_timeout.as_millis();
        if timeout_ms == 0 || timeout_ms > i32::MAX as u128 {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!(
                    "transaction_timeout {:?} is out of range",
                    self.transaction_timeout
                ),
            ));
        }
        config
            .set("transactional.id", id.as_str())
            .set("transaction.timeout.ms", timeout_ms.to_string());
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use connector_api::{CheckpointId, SubtaskId};

    use super::*;

    #[test]
    fn controlled_keys_cannot_be_overridden() {
        let mut config = KafkaSinkConfig::new("127.0.0.1:9092", "t", "p");
        config
            .client
            .insert("enable.idempotence".into(), "false".into());
        let id = config
            .id_pool()
            .unwrap()
            .for_checkpoint(SubtaskId(0), CheckpointId(1));
        let err = config.producer_config(&id).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(
            err.to_string()
                .contains("\"enable.idempotence\" is controlled"),
            "{err}"
        );
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // the test reads a variable every environment has
    fn client_settings_come_from_the_environment_and_stay_redacted() {
        let home = std::env::var("HOME").expect("HOME is set for tests");
        let mut config = KafkaSinkConfig::new("b:9092", "t", "p");
        config
            .client_env
            .insert("sasl.password".into(), "HOME".into());
        let resolved = config.clone().resolve_env().unwrap();
        assert_eq!(resolved.client["sasl.password"], home);
        assert!(!format!("{resolved:?}").contains(&home), "{resolved:?}");

        config.client_env.insert(
            "ssl.key.password".into(),
            "RATCHET_SURELY_UNSET_VARIABLE".into(),
        );
        let err = config.resolve_env().unwrap_err().to_string();
        assert!(
            err.contains("RATCHET_SURELY_UNSET_VARIABLE") && err.contains("ssl.key.password"),
            "{err}"
        );
    }

    #[test]
    fn secrets_in_client_settings_are_redacted_in_debug() {
        let mut config = KafkaSinkConfig::new("b:9092", "t", "p");
        config
            .client
            .insert("sasl.password".into(), "hunter2-secret-value".into());
        config.client.insert("linger.ms".into(), "5".into());
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("<redacted>") && shown.contains("linger.ms"),
            "{shown}"
        );
    }

    #[test]
    fn every_client_gets_the_connection_settings_and_unsupported_ones_are_refused() {
        let mut config = KafkaSinkConfig::new("b:9092", "t", "p");
        config
            .client
            .insert("socket.timeout.ms".into(), "5000".into());
        config.client.insert("linger.ms".into(), "5".into());
        let connection = config.kafka_connection().unwrap().client_config();
        assert_eq!(connection.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(connection.get("socket.timeout.ms"), Some("5000"));
        assert_eq!(connection.get("linger.ms"), None);
        config.validate().unwrap();
        config
            .client
            .insert("security.protocol".into(), "SASL_SSL".into());
        config
            .client
            .insert("sasl.mechanism".into(), "OAUTHBEARER".into());
        let err = config.validate().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(
            err.to_string().contains("sasl.mechanism=OAUTHBEARER"),
            "{err}"
        );
    }

    #[test]
    fn producer_config_is_transactional_and_idempotent() {
        let mut config = KafkaSinkConfig::new("127.0.0.1:9092", "t", "p");
        config.client.insert("linger.ms".into(), "5".into());
        let id = config
            .id_pool()
            .unwrap()
            .for_checkpoint(SubtaskId(0), CheckpointId(1));
        let client = config.producer_config(&id).unwrap();
        assert_eq!(client.get("transactional.id"), Some("p-0-1"));
        assert_eq!(client.get("enable.idempotence"), Some("true"));
        assert_eq!(client.get("acks"), Some("all"));
        assert_eq!(client.get("transaction.timeout.ms"), Some("600000"));
        assert_eq!(client.get("linger.ms"), Some("5"));
    }
}
