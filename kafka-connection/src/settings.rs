//! The connection settings of a Kafka client, in librdkafka's names, and what they mean for the protocol-level
//! client.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use connector_api::{Error, ErrorKind, Phase, Result};
use connector_common::tls::{ServerCheck, TlsSettings};
use rdkafka::ClientConfig;
use tokio_rustls::TlsConnector;

/// Prefixes of librdkafka settings that say how to reach the cluster (security, sockets): every client gets them.
pub const CONNECTION_PREFIXES: &[&str] = &[
    "security.protocol",
    "ssl.",
    "enable.ssl.certificate.verification",
    "sasl.",
    "socket.",
    "client.dns.lookup",
    "broker.address.family",
];

/// `ssl.*` settings that only tune librdkafka's OpenSSL and do not change whom the client trusts or who it is:
/// the protocol-level client, which uses rustls' defaults, may ignore them.
const TUNING_ONLY_SSL: &[&str] = &["ssl.cipher.suites", "ssl.curves.list", "ssl.sigalgs.list"];

/// librdkafka consumer settings every Ratchet consumer starts from (settings given to the consumer override them).
///
/// `fetch.queue.backoff.ms`: librdkafka stops fetching a partition for this long once its local queue holds
/// `queued.min.messages` (100 000) records. Its default, 1 s, is most of a second of idle fetcher per queue refill:
/// one partition of ~100-byte records then tops out near 160k records/s on this machine, against 2.3M records/s at
/// 10 ms (docs/benchmarks.md). The queue bounds (`queued.min.messages`, `queued.max.messages.kbytes`) are unchanged,
/// so memory stays bounded.
pub const CONSUMER_DEFAULTS: &[(&str, &str)] = &[("fetch.queue.backoff.ms", "10")];

/// The SASL mechanisms every client of Ratchet speaks (librdkafka and the protocol-level client).
pub const SASL_MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// Whether a librdkafka setting holds a secret (`sasl.password`, `ssl.key.password`, `ssl.keystore.password`,
/// `sasl.oauthbearer.client.secret`, ...): such values are redacted in `Debug` and never put in messages.
pub fn is_secret(key: &str) -> bool {
    key.contains("password") || key.contains("secret")
}

/// SASL credentials of the protocol-level client.
#[derive(Clone)]
pub(crate) struct SaslCredentials {
    pub(crate) mechanism: &'static str,
    pub(crate) username: String,
    pub(crate) password: String,
}

/// What the protocol-level client does on top of TCP.
#[derive(Clone, Default)]
pub(crate) struct WireSecurity {
    pub(crate) tls: Option<TlsConnector>,
    pub(crate) sasl: Option<SaslCredentials>,
}

/// How one Kafka client reaches the cluster: the bootstrap servers and the connection settings (`security.protocol`,
/// `ssl.*`, `sasl.*`, `socket.*`, ...), in librdkafka's names.
///
/// Both kinds of client start here: [`client_config`](Self::client_config) for librdkafka producers, consumers and
/// admin clients, and [`open`](Self::open) for the protocol-level requests librdkafka cannot make. So a cluster
/// that needs TLS or SASL works for every client or is refused at construction, never half-way.
///
/// Supported: `security.protocol` PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL; `sasl.mechanism` PLAIN,
/// SCRAM-SHA-256, SCRAM-SHA-512 with `sasl.username` and `sasl.password`; `ssl.ca.location` (a PEM file, or
/// `probe`/unset for the system trust store), `ssl.certificate.location` with `ssl.key.location` (PEM,
/// unencrypted key), `ssl.endpoint.identification.algorithm` (`https`, the default, or `none`),
/// `enable.ssl.certificate.verification`.
#[derive(Clone)]
pub struct KafkaConnection {
    bootstrap_servers: String,
    settings: BTreeMap<String, String>,
    pub(crate) wire: Arc<WireSecurity>,
}

impl std::fmt::Debug for KafkaConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConnection")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("settings", &redacted(&self.settings))
            .finish()
    }
}

/// `settings` with every secret value replaced by `<redacted>`, for `Debug` output and logs.
pub fn redacted(settings: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    settings
        .iter()
        .map(|(k, v)| {
            (
                k.as_str(),
                if is_secret(k) {
                    "<redacted>"
                } else {
                    v.as_str()
                },
            )
        })
        .collect()
}

fn config_error(message: String) -> Error {
    Error::new(ErrorKind::Config, Phase::Setup, message)
}

impl KafkaConnection {
    /// A connection to `bootstrap_servers` over PLAINTEXT.
    pub fn plaintext(bootstrap_servers: impl Into<String>) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            settings: BTreeMap::new(),
            wire: Arc::new(WireSecurity::default()),
        }
    }

    /// The connection described by `bootstrap_servers` and the connection settings among `client` (other keys are
    /// left to the caller). Reads the CA, certificate and key files now.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the setting when a value is unknown or a combination cannot be
    /// honoured by every client (GSSAPI or OAUTHBEARER, an encrypted key, a key store, ...), or naming the file
    /// that cannot be read. No message contains a secret.
    pub fn new(
        bootstrap_servers: impl Into<String>,
        client: &BTreeMap<String, String>,
    ) -> Result<Self> {
        let settings: BTreeMap<String, String> = client
            .iter()
            .filter(|(k, _)| CONNECTION_PREFIXES.iter().any(|p| k.starts_with(p)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let wire = wire_security(&settings)?;
        Ok(Self {
            bootstrap_servers: bootstrap_servers.into(),
            settings,
            wire: Arc::new(wire),
        })
    }

    /// The bootstrap servers, comma-separated.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap_servers
    }

    /// The librdkafka settings every consumer starts from: [`client_config`](Self::client_config) and
    /// [`CONSUMER_DEFAULTS`].
    pub fn consumer_config(&self) -> ClientConfig {
        let mut config = self.client_config();
        for (key, value) in CONSUMER_DEFAULTS {
            config.set(*key, *value);
        }
        config
    }

    /// The librdkafka settings every client starts from: `bootstrap.servers` and the connection settings.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap_servers);
        for (key, value) in &self.settings {
            config.set(key, value);
        }
        config
    }
}

/// The protocol-level client's TLS and SASL, from librdkafka's settings.
fn wire_security(settings: &BTreeMap<String, String>) -> Result<WireSecurity> {
    let get = |key: &str| settings.get(key).map(String::as_str);
    let protocol = get("security.protocol")
        .unwrap_or("plaintext")
        .to_ascii_lowercase();
    let (tls, sasl) = match protocol.as_str() {
        "plaintext" => (false, false),
        "ssl" => (true, false),
        "sasl_plaintext" => (false, true),
        "sasl_ssl" => (true, true),
        other => {
            return Err(config_error(format!(
                "client security.protocol={other} is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
            )));
        }
    };
    Ok(WireSecurity {
        tls: if tls {
            Some(TlsConnector::from(Arc::new(
                tls_settings(settings)?.client_config()?,
            )))
        } else {
            None
        },
        sasl: if sasl {
            Some(sasl_credentials(settings)?)
        } else {
            None
        },
    })
}

fn tls_settings(settings: &BTreeMap<String, String>) -> Result<TlsSettings> {
    const HANDLED: &[&str] = &[
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.endpoint.identification.algorithm",
    ];
    for key in settings.keys().filter(|k| k.starts_with("ssl.")) {
        if !HANDLED.contains(&key.as_str()) && !TUNING_ONLY_SSL.contains(&key.as_str()) {
            return Err(config_error(format!(
                "client {key} is not supported: Ratchet's protocol-level Kafka client (which commits a dead \
                 process's transaction) reads PEM files only; use {}",
                HANDLED.join(", ")
            )));
        }
    }
    let get = |key: &str| settings.get(key).map(String::as_str);
    let ca_file = match get("ssl.ca.location") {
        None | Some("probe") => None,
        Some(path) => {
            let path = PathBuf::from(path);
            if path.is_dir() {
                return Err(config_error(format!(
                    "client ssl.ca.location={} is a directory; name a PEM file of the CA certificates",
                    path.display()
                )));
            }
            Some(path)
        }
    };
    let client_identity = match (get("ssl.certificate.location"), get("ssl.key.location")) {
        (Some(cert), Some(key)) => Some((cert.into(), key.into())),
        (None, None) => None,
        _ => {
            return Err(config_error(
                "client ssl.certificate.location and ssl.key.location go together: give both, or neither".into(),
            ));
        }
    };
    let verify =
        get("enable.ssl.certificate.verification").is_none_or(|v| !v.eq_ignore_ascii_case("false"));
    let server_check = match (verify, get("ssl.endpoint.identification.algorithm")) {
        (false, _) => ServerCheck::Off,
        (true, None | Some("https")) => ServerCheck::Full,
        (true, Some("none")) => ServerCheck::ChainOnly,
        (true, Some(other)) => {
            return Err(config_error(format!(
                "client ssl.endpoint.identification.algorithm={other} is not one of https, none"
            )));
        }
    };
    Ok(TlsSettings {
        ca_file,
        client_identity,
        server_check,
    })
}

fn sasl_credentials(settings: &BTreeMap<String, String>) -> Result<SaslCredentials> {
    let get = |key: &str| settings.get(key).map(String::as_str);
    let named = get("sasl.mechanism").or(get("sasl.mechanisms"));
    let mechanism = match named {
        None => {
            return Err(config_error(format!(
                "client security.protocol is SASL but sasl.mechanism is not set (librdkafka would try GSSAPI); \
                 set it to one of {}",
                SASL_MECHANISMS.join(", ")
            )));
        }
        Some(named) => SASL_MECHANISMS
            .iter()
            .find(|m| m.eq_ignore_ascii_case(named.trim()))
            .ok_or_else(|| {
                config_error(format!(
                    "client sasl.mechanism={named} is not supported; Ratchet speaks {}",
                    SASL_MECHANISMS.join(", ")
                ))
            })?,
    };
    let required = |key: &str| {
        get(key).map(str::to_string).ok_or_else(|| {
            config_error(format!(
                "client sasl.mechanism={mechanism} needs {key} (in `client`, or from the environment with \
                 `client_env`)"
            ))
        })
    };
    Ok(SaslCredentials {
        mechanism,
        username: required("sasl.username")?,
        password: required("sasl.password")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_connection_settings_reach_every_client() {
        let connection = KafkaConnection::new(
            "b:9092",
            &settings(&[("socket.timeout.ms", "5000"), ("linger.ms", "5")]),
        )
        .unwrap();
        let config = connection.client_config();
        assert_eq!(config.get("socket.timeout.ms"), Some("5000"));
        assert_eq!(config.get("linger.ms"), None);
        assert_eq!(config.get("bootstrap.servers"), Some("b:9092"));
    }

    #[test]
    fn sasl_needs_a_supported_mechanism_and_credentials() {
        let err = KafkaConnection::new(
            "b:9092",
            &settings(&[("security.protocol", "SASL_PLAINTEXT")]),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("sasl.mechanism is not set"),
            "{err}"
        );
        let err = KafkaConnection::new(
            "b:9092",
            &settings(&[
                ("security.protocol", "SASL_PLAINTEXT"),
                ("sasl.mechanism", "GSSAPI"),
            ]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("GSSAPI is not supported"), "{err}");
        let err = KafkaConnection::new(
            "b:9092",
            &settings(&[
                ("security.protocol", "SASL_PLAINTEXT"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.username", "u"),
            ]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("needs sasl.password"), "{err}");
    }

    #[test]
    fn tls_settings_the_wire_client_cannot_honour_are_refused_by_name() {
        let err = KafkaConnection::new(
            "b:9092",
            &settings(&[
                ("security.protocol", "SSL"),
                ("ssl.keystore.location", "/k.p12"),
            ]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("ssl.keystore.location"), "{err}");
        let err = KafkaConnection::new(
            "b:9092",
            &settings(&[
                ("security.protocol", "SSL"),
                ("ssl.key.password", "hunter2-secret"),
            ]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("ssl.key.password"), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn debug_redacts_secrets() {
        let connection = KafkaConnection::new(
            "b:9092",
            &settings(&[
                ("security.protocol", "SASL_PLAINTEXT"),
                ("sasl.mechanism", "PLAIN"),
                ("sasl.username", "u"),
                ("sasl.password", "hunter2-secret"),
            ]),
        )
        .unwrap();
        let shown = format!("{connection:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}
