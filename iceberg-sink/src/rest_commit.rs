//! Ratchet's own catalog commit for an Iceberg REST catalog: the commit endpoint with requirements, for the
//! snapshots iceberg-rust 0.10's `RestCatalog::update_table` cannot be handed (its `TableCommit` is built only by
//! its own `Transaction` actions; a snapshot whose manifest list was merged is not one of them).
//!
//! # The protocol (Iceberg REST catalog OpenAPI spec, `updateTable`)
//! `POST {uri}/v1/{prefix}/namespaces/{namespace}/tables/{table}` with `{"identifier", "requirements",
//! "updates"}`; the server checks the requirements (table UUID, main branch still at the snapshot the updates were
//! planned on), applies the updates, writes the metadata file and swaps the table's pointer atomically.
//! 200: committed (the answer carries the new metadata). 409: another writer moved the table first, nothing
//! committed. A 5xx, 408, 419 or 429, a timeout or a broken connection: the outcome is unknown (the spec's "commit
//! state unknown") or the server asks to come back later; both are retried, and the caller's next attempt reloads
//! the table and its ledger check finds a commit that landed. Any other status (400, 403, 404) is refused with
//! the server's message; a 401 is retried once with a fresh token when a credential is configured.
//!
//! The client speaks the protocol as iceberg-rust's `RestCatalog` does, from the same properties: `GET /v1/config`
//! (with `warehouse`) gives the `prefix` (and may override `uri`); a `token` property is sent as a bearer token; a
//! `credential` (`client_id:secret`) is exchanged for one at `oauth2-server-uri` (default `{uri}/v1/oauth/tokens`)
//! with the OAuth2 client-credentials grant and `scope` (default `catalog`), `audience`, `resource`; `header.*`
//! properties are sent as headers. A 401 gets one fresh token and one more try.

use std::collections::HashMap;

use iceberg::table::Table;
use iceberg::{Error, ErrorKind, Result, TableRequirement, TableUpdate};
use iceberg_catalog_rest::{CommitTableRequest, CommitTableResponse};
use reqwest::{Client, RequestBuilder, StatusCode};
use tokio::sync::Mutex;

use crate::swap_outcome::SwapOutcome;

/// The REST catalog's commit endpoint, reached with the properties the catalog was opened with.
pub(crate) struct RestCommit {
    client: Client,
    uri: String,
    warehouse: Option<String>,
    props: HashMap<String, String>,
    /// The server's answer to `/v1/config`, merged (prefix, uri), once fetched.
    resolved: Mutex<Option<Resolved>>,
    token: Mutex<Option<String>>,
}

#[derive(Debug, Clone)]
struct Resolved {
    uri: String,
    prefix: Option<String>,
}

impl std::fmt::Debug for RestCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestCommit")
            .field("uri", &connector_common::config::redact_url(&self.uri))
            .field("warehouse", &self.warehouse)
            .finish_non_exhaustive()
    }
}

#[derive(serde::Deserialize)]
struct ConfigResponse {
    #[serde(default)]
    defaults: HashMap<String, String>,
    #[serde(default)]
    overrides: HashMap<String, String>,
}

#[derive(serde::Deserialize)]
struct TokenResponse {
    access_token: String,
}

impl RestCommit {
    /// A client for the catalog at `uri` with `warehouse` and the REST catalog's `props` (`token`,
    /// `credential`, `oauth2-server-uri`, `scope`, `audience`, `resource`, `header.*`). Connects on first use.
    pub(crate) fn new(
        uri: &str,
        warehouse: Option<String>,
        props: HashMap<String, String>,
    ) -> Self {
        Self {
            client: Client::new(),
            uri: uri.trim_end_matches('/').to_string(),
            warehouse,
            token: Mutex::new(props.get("token").cloned()),
            props,
            resolved: Mutex::new(None),
        }
    }

    /// Commits `updates` planned on `base` under `requirements` (module docs).
    ///
    /// # Errors
    /// `Unexpected` when the outcome is unknown (5xx, a broken connection); `DataInvalid` with the server's
    /// message when it refused the commit for another reason (nothing committed, retrying would not help).
    pub(crate) async fn commit(
        &self,
        base: &Table,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<SwapOutcome> {
        let ident = base.identifier();
        let resolved = self.resolved().await?;
        let namespace = ident.namespace().join("\u{1f}");
        let mut url = reqwest::Url::parse(&resolved.uri).map_err(|e| {
            Error::new(
                ErrorKind::DataInvalid,
                "the REST catalog's uri is not a URL",
            )
            .with_source(e)
        })?;
        {
            let mut path = url.path_segments_mut().map_err(|_| {
                Error::new(
                    ErrorKind::DataInvalid,
                    "the REST catalog's uri cannot take a path",
                )
            })?;
            path.pop_if_empty().push("v1");
            if let Some(prefix) = &resolved.prefix {
                path.extend(prefix.split('/'));
            }
            path.extend(["namespaces", namespace.as_str(), "tables", ident.name()]);
        }
        let body = CommitTableRequest {
            identifier: Some(ident.clone()),
            requirements,
            updates,
        };
        let mut refreshed = false;
        loop {
            let request = self.client.post(url.clone()).json(&body);
            let response = self
                .authorized(request)
                .await?
                .send()
                .await
                .map_err(|e| unknown(ident, "the request failed").with_source(e))?;
            let status = response.status();
            match status {
                StatusCode::OK => {
                    let committed: CommitTableResponse = response.json().await.map_err(|e| {
                        unknown(ident, "the answer to the commit could not be read").with_source(e)
                    })?;
                    return Ok(SwapOutcome::Committed(Box::new(
                        Table::builder()
                            .file_io(base.file_io().clone())
                            .identifier(ident.clone())
                            .metadata_location(committed.metadata_location)
                            .metadata(committed.metadata)
                            .runtime(iceberg::Runtime::try_current()?)
                            .build()?,
                    )));
                }
                StatusCode::CONFLICT => return Ok(SwapOutcome::Conflict),
                StatusCode::UNAUTHORIZED if !refreshed && self.props.contains_key("credential") => {
                    *self.token.lock().await = None;
                    refreshed = true;
                }
                s if s.is_server_error()
                    || s == StatusCode::REQUEST_TIMEOUT
                    || s == StatusCode::TOO_MANY_REQUESTS
                    || s.as_u16() == 419 =>
                {
                    let text = response.text().await.unwrap_or_default();
                    return Err(unknown(ident, &format!("the catalog answered {s}: {text}")));
                }
                s => {
                    let text = response.text().await.unwrap_or_default();
                    return Err(Error::new(
                        ErrorKind::DataInvalid,
                        format!(
                            "the REST catalog refused the commit to table {ident} with {s}: {text}"
                        ),
                    ));
                }
            }
        }
    }

    /// `/v1/config` merged as iceberg's `RestCatalog` merges it: defaults, then the user's, then overrides.
    async fn resolved(&self) -> Result<Resolved> {
        let mut resolved = self.resolved.lock().await;
        if let Some(known) = resolved.as_ref() {
            return Ok(known.clone());
        }
        let mut request = self.client.get(format!("{}/v1/config", self.uri));
        if let Some(warehouse) = &self.warehouse {
            request = request.query(&[("warehouse", warehouse)]);
        }
        let response = self.authorized(request).await?.send().await.map_err(|e| {
            Error::new(ErrorKind::Unexpected, "cannot reach the REST catalog").with_source(e)
        })?;
        let response = expect_ok(
            response,
            "/v1/config",
            "check the catalog's uri, warehouse and credential",
        )
        .await?;
        let config: ConfigResponse = response.json().await.map_err(|e| {
            Error::new(
                ErrorKind::Unexpected,
                "the REST catalog's /v1/config could not be read",
            )
            .with_source(e)
        })?;
        let mut props = config.defaults;
        props.extend(self.props.clone());
        props.extend(config.overrides);
        let known = Resolved {
            uri: props
                .get("uri")
                .map(|u| u.trim_end_matches('/').to_string())
                .unwrap_or_else(|| self.uri.clone()),
            prefix: props.get("prefix").filter(|p| !p.is_empty()).cloned(),
        };
        *resolved = Some(known.clone());
        Ok(known)
    }

    /// `request` with the `header.*` properties and a bearer token, when the catalog is given one or a credential.
    async fn authorized(&self, mut request: RequestBuilder) -> Result<RequestBuilder> {
        for (key, value) in &self.props {
            if let Some(name) = key.strip_prefix("header.") {
                request = request.header(name, value);
            }
        }
        let mut token = self.token.lock().await;
        if token.is_none()
            && let Some(credential) = self.props.get("credential")
        {
            *token = Some(self.exchange(credential).await?);
        }
        Ok(match token.as_ref() {
            Some(token) => request.bearer_auth(token),
            None => request,
        })
    }

    /// The OAuth2 client-credentials grant, as iceberg's `RestCatalog` makes it.
    async fn exchange(&self, credential: &str) -> Result<String> {
        let (client_id, secret) = match credential.split_once(':') {
            Some((id, secret)) => (Some(id), secret),
            None => (None, credential),
        };
        let mut form: Vec<(&str, &str)> = vec![("grant_type", "client_credentials")];
        if let Some(id) = client_id {
            form.push(("client_id", id));
        }
        form.push(("client_secret", secret));
        form.push((
            "scope",
            self.props.get("scope").map_or("catalog", String::as_str),
        ));
        for extra in ["audience", "resource"] {
            if let Some(value) = self.props.get(extra) {
                form.push((extra, value));
            }
        }
        let endpoint = self
            .props
            .get("oauth2-server-uri")
            .cloned()
            .unwrap_or_else(|| format!("{}/v1/oauth/tokens", self.uri));
        let response = self
            .client
            .post(endpoint)
            .form(&form)
            .send()
            .await
            .map_err(|e| {
                Error::new(
                    ErrorKind::Unexpected,
                    "cannot reach the REST catalog's token endpoint",
                )
                .with_source(e)
            })?;
        let response = expect_ok(
            response,
            "token endpoint",
            "check the credential in credential_env, and scope / oauth2-server-uri in props",
        )
        .await?;
        let token: TokenResponse = response.json().await.map_err(|e| {
            Error::new(
                ErrorKind::Unexpected,
                "the REST catalog's token could not be read",
            )
            .with_source(e)
        })?;
        Ok(token.access_token)
    }
}

/// `response` when it is a 200; else an error naming the catalog's `endpoint`, the status, the server's text and
/// what to check (`hint`): a client error is a setting to fix (refused), a server error may pass (retried).
async fn expect_ok(
    response: reqwest::Response,
    endpoint: &str,
    hint: &str,
) -> Result<reqwest::Response> {
    let status = response.status();
    if status == StatusCode::OK {
        return Ok(response);
    }
    let text = response.text().await.unwrap_or_default();
    let kind = if status.is_client_error() {
        ErrorKind::DataInvalid
    } else {
        ErrorKind::Unexpected
    };
    Err(Error::new(
        kind,
        format!("the REST catalog's {endpoint} answered {status}: {text} ({hint})"),
    ))
}

fn unknown(ident: &iceberg::TableIdent, what: &str) -> Error {
    Error::new(
        ErrorKind::Unexpected,
        format!("the commit to table {ident} has an unknown outcome: {what}"),
    )
}
