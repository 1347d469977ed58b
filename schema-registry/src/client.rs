//! [`SchemaRegistry`]: the requests Ratchet makes, bounded, retried while the registry is unavailable, and cached
//! where the answer can never change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use connector_api::RetryPolicy;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};

use crate::schema::{ErrorBody, SchemaBody};
use crate::settings::Auth;
use crate::{RegisteredSchema, RegistryError, RegistrySettings, SchemaType};

/// The API's request body type.
const SCHEMA_REGISTRY_JSON: &str = "application/vnd.schemaregistry.v1+json";

/// The body of a registration's answer.
#[derive(serde::Deserialize)]
struct RegisteredId {
    id: u32,
}

/// What the API's clients send as `Accept`.
const ACCEPT_SCHEMA_REGISTRY: &str = "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json; qs=0.9, application/json; qs=0.5";

/// A client of one registry. Cheap to clone (clones share the connection pool and the cache).
///
/// Each clone must be used from one tokio runtime (the connection pool's tasks live on the runtime that made
/// them): a thread with a runtime of its own makes its own client with [`SchemaRegistry::new`].
#[derive(Clone)]
pub struct SchemaRegistry {
    http: reqwest::Client,
    base: url::Url,
    auth: Arc<Auth>,
    retry: RetryPolicy,
    /// Schemas by global id: an id's schema never changes.
    by_id: Arc<Mutex<HashMap<u32, RegisteredSchema>>>,
}

impl std::fmt::Debug for SchemaRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaRegistry")
            .field("url", &self.base.as_str())
            .finish_non_exhaustive()
    }
}

impl SchemaRegistry {
    /// A client of the registry `settings` describe. Connects on first use.
    ///
    /// # Errors
    /// [`RegistryError::Settings`] for a URL that does not parse, credentials given twice or half, TLS settings on
    /// a plain `http://` URL, or a CA file or client certificate that cannot be read.
    pub fn new(settings: &RegistrySettings) -> Result<Self, RegistryError> {
        let (base, auth) = settings.endpoint()?;
        let tls = settings
            .tls()?
            .client_config()
            .map_err(|e| RegistryError::Settings(format!("TLS: {e}")))?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .connect_timeout(settings.request_timeout)
            .timeout(settings.request_timeout)
            .build()
            .map_err(|e| RegistryError::Settings(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            http,
            base,
            auth: Arc::new(auth),
            retry: RetryPolicy::default(),
            by_id: Arc::default(),
        })
    }

    /// The same client, retrying transient failures under `retry` instead of [`RetryPolicy::default`].
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The registry's base URL (without credentials).
    pub fn url(&self) -> &str {
        self.base.as_str()
    }

    /// The schema with global id `id` (`GET /schemas/ids/{id}`), from the cache after the first time.
    ///
    /// # Errors
    /// [`RegistryError::Status`] with status 404 ([`RegistryError::is_not_found`]) when the registry has no such
    /// id; any other [`RegistryError`] when the request fails (after retries, for transient failures).
    pub async fn schema(&self, id: u32) -> Result<RegisteredSchema, RegistryError> {
        if let Some(schema) = self.cached(id) {
            return Ok(schema);
        }
        let body = self.get(&["schemas", "ids", &id.to_string()]).await?;
        let schema = RegisteredSchema {
            id,
            schema: body.schema,
            schema_type: body.schema_type,
            references: body.references.unwrap_or_default(),
            version: None,
        };
        self.by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, schema.clone());
        Ok(schema)
    }

    /// The latest version of `subject` (`GET /subjects/{subject}/versions/latest`): asked every time.
    ///
    /// # Errors
    /// [`RegistryError::Status`] with status 404 when the subject does not exist; [`RegistryError::Malformed`]
    /// when the answer has no id; any other [`RegistryError`] when the request fails.
    pub async fn latest(&self, subject: &str) -> Result<RegisteredSchema, RegistryError> {
        self.version(subject, "latest").await
    }

    /// Version `version` (a number, or `latest`) of `subject` (`GET /subjects/{subject}/versions/{version}`),
    /// as a schema reference names it: asked every time.
    ///
    /// # Errors
    /// As [`latest`](Self::latest).
    pub async fn version(
        &self,
        subject: &str,
        version: &str,
    ) -> Result<RegisteredSchema, RegistryError> {
        let request = ["subjects", subject, "versions", version];
        let body = self.get(&request).await?;
        let id = body.id.ok_or_else(|| RegistryError::Malformed {
            url: self.base.to_string(),
            request: format!("GET {}", self.path(&request).path()),
            reason: "it has no `id`".into(),
        })?;
        let version = body
            .version
            .map(|v| (body.subject.unwrap_or_else(|| subject.to_string()), v));
        Ok(RegisteredSchema {
            id,
            schema: body.schema,
            schema_type: body.schema_type,
            references: body.references.unwrap_or_default(),
            version,
        })
    }

    /// Registers Avro `schema` under `subject` (`POST /subjects/{subject}/versions`) and returns its global id: the
    /// existing one when the subject already has this schema (registering is idempotent), a new version
    /// otherwise. The registry checks the subject's compatibility rule first.
    ///
    /// # Errors
    /// [`RegistryError::Status`] with 409 when the schema is incompatible with the subject's earlier versions, 422
    /// when it is not a valid schema; any other [`RegistryError`] when the request fails.
    pub async fn register(&self, subject: &str, schema: &str) -> Result<u32, RegistryError> {
        self.register_as(subject, schema, SchemaType::Avro).await
    }

    /// As [`register`](Self::register), for a schema of kind `schema_type` (`schemaType` in the request; absent
    /// for Avro, as the API defines).
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub async fn register_as(
        &self,
        subject: &str,
        schema: &str,
        schema_type: SchemaType,
    ) -> Result<u32, RegistryError> {
        let url = self.path(&["subjects", subject, "versions"]);
        let request = format!("POST {}", url.path());
        let body = match schema_type {
            SchemaType::Avro => serde_json::json!({ "schema": schema }),
            other => serde_json::json!({ "schema": schema, "schemaType": other.to_string() }),
        }
        .to_string();
        let answer: RegisteredId = self
            .retry
            .run_when(&request, RegistryError::is_transient, || {
                let call = self
                    .http
                    .post(url.clone())
                    .header(CONTENT_TYPE, HeaderValue::from_static(SCHEMA_REGISTRY_JSON))
                    .body(body.clone());
                self.send(call, &request)
            })
            .await?;
        Ok(answer.id)
    }

    fn cached(&self, id: u32) -> Option<RegisteredSchema> {
        self.by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// The base URL with `segments` appended (each percent-encoded: a subject may hold any character).
    fn path(&self, segments: &[&str]) -> url::Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// `GET` of `segments`, retried while transient.
    async fn get(&self, segments: &[&str]) -> Result<SchemaBody, RegistryError> {
        let url = self.path(segments);
        let request = format!("GET {}", url.path());
        self.retry
            .run_when(&request, RegistryError::is_transient, || {
                self.get_once(url.clone(), &request)
            })
            .await
    }

    async fn get_once(&self, url: url::Url, request: &str) -> Result<SchemaBody, RegistryError> {
        self.send(self.http.get(url), request).await
    }

    /// Sends `call` with the API's `Accept` header and the credentials; the answer's body as `T`.
    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        call: reqwest::RequestBuilder,
        request: &str,
    ) -> Result<T, RegistryError> {
        let mut call = call.header(ACCEPT, HeaderValue::from_static(ACCEPT_SCHEMA_REGISTRY));
        call = match self.auth.as_ref() {
            Auth::None => call,
            Auth::Basic(user, password) => call.basic_auth(user, Some(password.expose())),
            Auth::Bearer(token) => call.header(AUTHORIZATION, format!("Bearer {}", token.expose())),
        };
        let unavailable = |source: reqwest::Error| match tls_failure(&source) {
            Some(reason) => RegistryError::Tls {
                url: self.base.to_string(),
                request: request.to_string(),
                reason,
                source,
            },
            None => RegistryError::Unavailable {
                url: self.base.to_string(),
                request: request.to_string(),
                source,
            },
        };
        let response = call.send().await.map_err(unavailable)?;
        let status = response.status();
        let body = response.bytes().await.map_err(unavailable)?;
        if !status.is_success() {
            let error: Option<ErrorBody> = serde_json::from_slice(&body).ok();
            let text = String::from_utf8_lossy(&body);
            return Err(RegistryError::Status {
                url: self.base.to_string(),
                request: request.to_string(),
                status: status.as_u16(),
                code: error.as_ref().and_then(|e| e.error_code),
                message: error
                    .and_then(|e| e.message)
                    .unwrap_or_else(|| text.chars().take(300).collect()),
            });
        }
        serde_json::from_slice(&body).map_err(|e| RegistryError::Malformed {
            url: self.base.to_string(),
            request: request.to_string(),
            reason: e.to_string(),
        })
    }
}

/// rustls's reason, when `error` is a TLS handshake that failed its checks: rustls's error somewhere in the chain,
/// possibly inside I/O errors (whose `source` skips the error they wrap, so they are opened with `get_ref`).
fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return Some(tls.to_string());
    }
    if let Some(inner) = error
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::get_ref)
    {
        return tls_failure(inner);
    }
    error.source().and_then(tls_failure)
}
