//! How to reach the registry: its URL, credentials and TLS settings, as a job file's `[source.registry]` spells
//! them.

use std::path::PathBuf;
use std::time::Duration;

use connector_common::Secret;
use connector_common::tls::{ServerCheck, TlsSettings};
use serde::Deserialize;

use crate::RegistryError;

/// The registry's address and credentials.
///
/// | key | meaning | default |
/// |---|---|---|
/// | `url` | the API's base URL (`https://registry:8081`, Apicurio: `http://host:8080/apis/ccompat/v7`); user info in it (`https://user:pass@host`) is basic auth | required |
/// | `username`, `password` | HTTP basic auth (Confluent's `basic.auth.user.info`) | none |
/// | `bearer_token` | `Authorization: Bearer <token>` (Confluent's `bearer.auth.token`) | none |
/// | `ca_file` | PEM file of the CA certificates to trust (HTTPS) | the system trust store |
/// | `client_cert`, `client_key` | PEM files of a client certificate and its key, for registries that ask for one | none |
/// | `server_check` | `full` (chain and host name), `chain-only`, or `off` (encrypted, not authenticated) | `full` |
/// | `request_timeout` | one request's limit, connecting included | 10 s |
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    /// The API's base URL.
    pub url: String,
    /// Basic auth user.
    #[serde(default)]
    pub username: Option<String>,
    /// Basic auth password.
    #[serde(default)]
    pub password: Option<Secret<String>>,
    /// Bearer token.
    #[serde(default)]
    pub bearer_token: Option<Secret<String>>,
    /// CA certificates to trust (PEM).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM).
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    /// The client certificate's unencrypted private key (PEM).
    #[serde(default)]
    pub client_key: Option<PathBuf>,
    /// How much of the server's certificate is checked.
    #[serde(default)]
    pub server_check: ServerCheckSetting,
    /// One request's limit.
    #[serde(default = "ten_seconds", with = "humantime_serde")]
    pub request_timeout: Duration,
}

/// `server_check` of [`RegistrySettings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerCheckSetting {
    /// The chain up to a trusted CA and the host name.
    #[default]
    Full,
    /// The chain, not the name.
    ChainOnly,
    /// Nothing (the connection is encrypted, the server not authenticated).
    Off,
}

/// Debug output with the URL's password masked (the other secrets print as `<redacted>` by themselves).
impl std::fmt::Debug for RegistrySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrySettings")
            .field("url", &connector_common::config::redact_url(&self.url))
            .field("username", &self.username)
            .field("password", &self.password)
            .field("bearer_token", &self.bearer_token)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key)
            .field("server_check", &self.server_check)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

fn ten_seconds() -> Duration {
    Duration::from_secs(10)
}

/// How requests authenticate.
#[derive(Clone)]
pub(crate) enum Auth {
    None,
    Basic(String, Secret<String>),
    Bearer(Secret<String>),
}

impl RegistrySettings {
    /// The registry at `url`, no credentials, default TLS checks and timeout.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_string(),
            username: None,
            password: None,
            bearer_token: None,
            ca_file: None,
            client_cert: None,
            client_key: None,
            server_check: ServerCheckSetting::Full,
            request_timeout: ten_seconds(),
        }
    }

    /// The base URL without user info, and the authentication to use.
    pub(crate) fn endpoint(&self) -> Result<(url::Url, Auth), RegistryError> {
        let mut url = url::Url::parse(&self.url).map_err(|e| {
            RegistryError::Settings(format!(
                "url {:?} is not a URL ({e})",
                connector_common::config::redact_url(&self.url)
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(RegistryError::Settings(format!(
                "url {url} is not http:// or https://"
            )));
        }
        let from_url = (!url.username().is_empty()).then(|| {
            let user = percent_decoded(url.username());
            let password = percent_decoded(url.password().unwrap_or_default());
            (user, password)
        });
        // Neither credentials nor their absence must show in messages: the URL is kept without user info.
        let _ = url.set_username("");
        let _ = url.set_password(None);
        let auth = match (from_url, &self.username, &self.password, &self.bearer_token) {
            (None, None, None, None) => Auth::None,
            (None, None, None, Some(token)) => Auth::Bearer(token.clone()),
            (Some((user, password)), None, None, None) => Auth::Basic(user, Secret::new(password)),
            (None, Some(user), Some(password), None) => Auth::Basic(user.clone(), password.clone()),
            (None, Some(_), None, None) | (None, None, Some(_), None) => {
                return Err(RegistryError::Settings(
                    "basic auth needs both `username` and `password`".into(),
                ));
            }
            _ => {
                return Err(RegistryError::Settings(
                    "give one kind of credentials: user info in `url`, `username` + `password`, or \
                     `bearer_token`"
                        .into(),
                ));
            }
        };
        let tls_set = self.ca_file.is_some()
            || self.client_cert.is_some()
            || self.client_key.is_some()
            || self.server_check != ServerCheckSetting::Full;
        if url.scheme() == "http" && tls_set {
            return Err(RegistryError::Settings(format!(
                "TLS settings are given but url {url} is plain http://: use https://"
            )));
        }
        Ok((url, auth))
    }

    /// The TLS settings of the client.
    pub(crate) fn tls(&self) -> Result<TlsSettings, RegistryError> {
        let client_identity = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => {
                return Err(RegistryError::Settings(
                    "a client certificate needs both `client_cert` and `client_key`".into(),
                ));
            }
        };
        Ok(TlsSettings {
            ca_file: self.ca_file.clone(),
            client_identity,
            server_check: match self.server_check {
                ServerCheckSetting::Full => ServerCheck::Full,
                ServerCheckSetting::ChainOnly => ServerCheck::ChainOnly,
                ServerCheckSetting::Off => ServerCheck::Off,
            },
        })
    }
}

fn percent_decoded(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={text}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(toml_text: &str) -> RegistrySettings {
        serde_json::from_value(toml_like(toml_text)).unwrap()
    }

    /// `key = "value"` lines as a JSON object (the crate has no TOML parser; the worker tests the TOML side).
    fn toml_like(text: &str) -> serde_json::Value {
        let mut map = serde_json::Map::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (key, value) = line.split_once('=').unwrap();
            map.insert(
                key.trim().to_string(),
                serde_json::Value::String(value.trim().trim_matches('"').to_string()),
            );
        }
        serde_json::Value::Object(map)
    }

    #[test]
    fn credentials_come_from_one_place_and_never_stay_in_the_url() {
        let (url, auth) = settings("url = \"https://svc:p%40ss@registry:8081/\"")
            .endpoint()
            .unwrap();
        assert_eq!(url.as_str(), "https://registry:8081/");
        assert!(
            matches!(auth, Auth::Basic(user, password) if user == "svc" && password.expose() == "p@ss")
        );
        let (_, auth) =
            settings("url = \"http://registry:8081\"\nusername = \"svc\"\npassword = \"secret\"")
                .endpoint()
                .unwrap();
        assert!(matches!(auth, Auth::Basic(..)));
        let (_, auth) = settings("url = \"http://registry:8081\"\nbearer_token = \"t\"")
            .endpoint()
            .unwrap();
        assert!(matches!(auth, Auth::Bearer(..)));

        for (text, expected) in [
            (
                "url = \"http://r\"\nusername = \"svc\"",
                "both `username` and `password`",
            ),
            (
                "url = \"http://svc:x@r\"\nbearer_token = \"t\"",
                "one kind of credentials",
            ),
            ("url = \"ftp://r\"", "not http:// or https://"),
            ("url = \"http://r\"\nca_file = \"/ca.pem\"", "use https://"),
            ("url = \"registry:8081\"", "not http:// or https://"),
        ] {
            let err = settings(text).endpoint().err().unwrap();
            assert!(err.to_string().contains(expected), "{text}: {err}");
        }
        let err = settings("url = \"https://r\"\nclient_cert = \"/c.pem\"")
            .tls()
            .unwrap_err();
        assert!(err.to_string().contains("client_key"), "{err}");
    }

    #[test]
    fn a_password_never_shows_in_debug_output() {
        let basic = settings("url = \"http://r\"\nusername = \"svc\"\npassword = \"hunter2\"");
        let bearer = settings("url = \"http://r\"\nbearer_token = \"tok3n\"");
        let in_url = settings("url = \"http://svc:hunter2@r\"");
        for shown in [basic, bearer, in_url].map(|s| format!("{s:?}")) {
            assert!(
                !shown.contains("hunter2") && !shown.contains("tok3n"),
                "{shown}"
            );
        }
    }
}
