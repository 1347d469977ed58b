//! The protocol-level client: one connection to one broker, over TCP, TLS (rustls) and SASL (PLAIN, SCRAM via
//! rsasl) as the [`KafkaConnection`] says, framing requests whose wire format comes from the `kafka-protocol`
//! crate.
//!
//! Errors say [`Phase::Commit`] (the protocol-level client finishes transactions); a caller in another step sets
//! its own with [`Error::at_phase`]. Nothing here retries. Transport failures are
//! [`Retryable`](ErrorKind::Retryable); a TLS handshake or SASL authentication the broker refuses is
//! [`Config`](ErrorKind::Config): retrying does not fix a wrong CA file or password.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use connector_api::{Error, ErrorKind, Phase, Result};
use kafka_protocol::error::ParseResponseErrorCode;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
    SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use rsasl::prelude::{Mechname, SASLClient, SASLConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;

use crate::KafkaConnection;
use crate::settings::SaslCredentials;

/// How long one request (or the TCP connect, or the TLS handshake) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A byte stream to a broker: TCP, or TLS over TCP.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A transport or framing failure talking to `address`: retryable, with the cause attached.
fn transport_error(
    address: &str,
    what: &str,
    source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
) -> Error {
    Error::new(
        ErrorKind::Retryable,
        Phase::Commit,
        format!("Kafka {what} with {address} failed"),
    )
    .with_boxed_source(source.into())
}

/// One authenticated connection to one broker.
pub struct WireConnection {
    stream: Box<dyn Io>,
    address: String,
    correlation: i32,
    /// The broker's ApiVersions answer, asked once per connection.
    versions: Option<ApiVersionsResponse>,
}

impl KafkaConnection {
    /// Opens a protocol-level connection to the first bootstrap server.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub async fn open_bootstrap(&self) -> Result<WireConnection> {
        let first = self
            .bootstrap_servers()
            .split(',')
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        self.open(&first).await
    }

    /// Opens a protocol-level connection to the broker at `address` (`host:port`): TCP, then TLS and SASL when the
    /// settings say so.
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) when the broker cannot be reached; [`Config`](ErrorKind::Config) when
    /// the TLS handshake fails (certificate not trusted, wrong name) or the broker refuses the SASL mechanism or
    /// credentials (the user is named, the password is not).
    pub async fn open(&self, address: &str) -> Result<WireConnection> {
        let tcp = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(address))
            .await
            .map_err(|e| transport_error(address, "connect", e))?
            .map_err(|e| transport_error(address, "connect", e))?;
        tcp.set_nodelay(true)
            .map_err(|e| transport_error(address, "connect", e))?;
        let stream: Box<dyn Io> = match &self.wire.tls {
            None => Box::new(tcp),
            Some(connector) => {
                let host = address
                    .rsplit_once(':')
                    .map_or(address, |(host, _)| host)
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                let name = ServerName::try_from(host.to_string()).map_err(|e| {
                    Error::new(
                        ErrorKind::Config,
                        Phase::Setup,
                        format!("{host} (from {address}) is not a valid TLS server name"),
                    )
                    .with_source(e)
                })?;
                let tls = tokio::time::timeout(REQUEST_TIMEOUT, connector.connect(name, tcp))
                    .await
                    .map_err(|e| transport_error(address, "TLS handshake", e))?
                    .map_err(|e| tls_error(address, e))?;
                Box::new(tls)
            }
        };
        let mut connection = WireConnection {
            stream,
            address: address.to_string(),
            correlation: 0,
            versions: None,
        };
        if let Some(sasl) = &self.wire.sasl {
            connection.authenticate(sasl).await?;
        }
        Ok(connection)
    }
}

/// A failed TLS handshake: a rustls refusal (certificate, name, protocol) is a configuration problem; anything
/// else is transport.
fn tls_error(address: &str, e: std::io::Error) -> Error {
    let refused = e.get_ref().is_some_and(|inner| {
        inner
            .downcast_ref::<tokio_rustls::rustls::Error>()
            .is_some()
    });
    if refused {
        Error::new(
            ErrorKind::Config,
            Phase::Setup,
            format!(
                "the TLS handshake with {address} was refused: check ssl.ca.location (the CA that signed the \
                 broker's certificate), ssl.endpoint.identification.algorithm and the client certificate"
            ),
        )
        .with_source(e)
    } else {
        transport_error(address, "TLS handshake", e)
    }
}

impl WireConnection {
    /// The broker this connection talks to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// SaslHandshake (v1) naming the mechanism, then SaslAuthenticate rounds driven by rsasl until the mechanism
    /// finishes and the broker accepts.
    async fn authenticate(&mut self, sasl: &SaslCredentials) -> Result<()> {
        let refused = |message: String| Error::new(ErrorKind::Config, Phase::Setup, message);
        let handshake = self
            .send(
                1,
                &SaslHandshakeRequest::default()
                    .with_mechanism(StrBytes::from_static_str(sasl.mechanism)),
            )
            .await?;
        if let Some(e) = handshake.error_code.err() {
            let enabled: Vec<String> = handshake.mechanisms.iter().map(|m| m.to_string()).collect();
            return Err(refused(format!(
                "the broker at {} does not accept SASL mechanism {} (it accepts {})",
                self.address,
                sasl.mechanism,
                enabled.join(", ")
            ))
            .with_source(e));
        }
        let config =
            SASLConfig::with_credentials(None, sasl.username.clone(), sasl.password.clone())
                .map_err(|e| {
                    refused(format!(
                        "the SASL credentials of {} are unusable",
                        sasl.username
                    ))
                    .with_source(e)
                })?;
        let mechanism = Mechname::parse(sasl.mechanism.as_bytes()).map_err(|e| {
            Error::new(ErrorKind::Bug, Phase::Setup, "a SASL mechanism name").with_source(e)
        })?;
        let mut session = SASLClient::new(Arc::clone(&config))
            .start_suggested(&[mechanism])
            .map_err(|e| {
                Error::new(
                    ErrorKind::Bug,
                    Phase::Setup,
                    format!("SASL mechanism {} is not built in", sasl.mechanism),
                )
                .with_source(e)
            })?;
        let mut input: Option<Bytes> = None;
        loop {
            let mut out = Vec::new();
            let state = session.step(input.as_deref(), &mut out).map_err(|e| {
                refused(format!(
                    "SASL {} authentication as {} with {} failed on the client side",
                    sasl.mechanism, sasl.username, self.address
                ))
                .with_source(e)
            })?;
            if state.has_sent_message() {
                let response = self
                    .send(
                        1,
                        &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(out)),
                    )
                    .await?;
                if let Some(e) = response.error_code.err() {
                    let said = response
                        .error_message
                        .map(|m| m.to_string())
                        .unwrap_or_default();
                    return Err(refused(format!(
                        "the broker at {} refused SASL {} authentication as {}: {said}",
                        self.address, sasl.mechanism, sasl.username
                    ))
                    .with_source(e));
                }
                input = Some(response.auth_bytes);
            }
            if state.is_finished() {
                tracing::debug!(broker = %self.address, mechanism = sasl.mechanism, user = %sasl.username,
                    "SASL authenticated");
                return Ok(());
            }
        }
    }

    /// Sends `request` at `version` and reads its response.
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) for transport and framing failures (the connection is then unusable).
    pub async fn send<R: Request>(&mut self, version: i16, request: &R) -> Result<R::Response> {
        self.correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("ratchet")));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, R::header_version(version))
            .and_then(|()| request.encode(&mut body, version))
            .map_err(|e| {
                Error::new(ErrorKind::Bug, Phase::Commit, "cannot encode a request")
                    .with_boxed_source(e.into())
            })?;
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_i32(body.len() as i32);
        frame.extend_from_slice(&body);
        let address = self.address.clone();
        let stream = &mut self.stream;
        let exchange = async {
            stream.write_all(&frame).await?;
            stream.flush().await?;
            let length = stream.read_i32().await?;
            let mut response = vec![0u8; length.max(0) as usize];
            stream.read_exact(&mut response).await?;
            Ok::<_, std::io::Error>(response)
        };
        let response = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|e| transport_error(&address, "request", e))?
            .map_err(|e| transport_error(&address, "request", e))?;
        let mut bytes = Bytes::from(response);
        let header = ResponseHeader::decode(&mut bytes, R::Response::header_version(version))
            .map_err(|e| transport_error(&address, "response header", e))?;
        if header.correlation_id != self.correlation {
            return Err(transport_error(
                &address,
                "response",
                format!(
                    "correlation id {} instead of {}",
                    header.correlation_id, self.correlation
                ),
            ));
        }
        let decoded = R::Response::decode(&mut bytes, version)
            .map_err(|e| transport_error(&address, "response", e))?;
        if bytes.has_remaining() {
            tracing::debug!(left = bytes.remaining(), "response had trailing bytes");
        }
        Ok(decoded)
    }

    /// The highest version of `key` both sides support, at most `ours` (ApiVersions is asked once per
    /// connection).
    ///
    /// # Errors
    /// [`Fatal`](ErrorKind::Fatal) when the broker does not support `key` at all.
    pub async fn version(&mut self, key: ApiKey, ours: i16) -> Result<i16> {
        if self.versions.is_none() {
            self.versions = Some(self.send(0, &ApiVersionsRequest::default()).await?);
        }
        let versions = self.versions.as_ref().expect("asked above");
        let theirs = versions
            .api_keys
            .iter()
            .find(|k| k.api_key == key as i16)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Fatal,
                    Phase::Setup,
                    format!(
                        "the broker at {} does not support {key:?}; Kafka 3.0 or later is needed",
                        self.address
                    ),
                )
            })?;
        Ok(ours.min(theirs.max_version))
    }
}
