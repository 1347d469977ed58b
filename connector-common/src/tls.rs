//! TLS for the clients Ratchet speaks itself (the Kafka protocol-level client, PostgreSQL): one place that turns
//! a CA file, an optional client certificate and a server-check level into a rustls client configuration.
//!
//! Certificates and keys are PEM files. Without a CA file the system's trust store is used. Errors name the file
//! and never its contents.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::crypto::{CryptoProvider, aws_lc_rs, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::{Error, Result};

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCheck {
    /// The chain up to a trusted CA, and the host name (or IP address) the client connected to. The default.
    Full,
    /// The chain up to a trusted CA, not the name (PostgreSQL `sslmode=verify-ca`, librdkafka
    /// `ssl.endpoint.identification.algorithm=none`).
    ChainOnly,
    /// Nothing: the connection is encrypted but the server is not authenticated (PostgreSQL `sslmode=require`
    /// without a root certificate, librdkafka `enable.ssl.certificate.verification=false`).
    Off,
}

/// The TLS settings of one client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM file of the CA certificates to trust; `None` = the system trust store.
    pub ca_file: Option<PathBuf>,
    /// PEM files of the client certificate (chain) and its unencrypted private key, for servers that ask for one.
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// How much of the server certificate is checked.
    pub server_check: ServerCheck,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            ca_file: None,
            client_identity: None,
            server_check: ServerCheck::Full,
        }
    }
}

fn tls_error(message: String) -> Error {
    Error::config(message)
}

/// A file that cannot be read or parsed; the cause is the error's source, not repeated in the message.
fn file_error(what: &str, path: &Path, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::config(format!("cannot read the {what} {}", path.display())).with_source(e)
}

/// A file that was read but holds nothing usable.
fn useless_file(what: &str, path: &Path, reason: &str) -> Error {
    Error::config(format!("the {what} {} holds {reason}", path.display()))
}

impl TlsSettings {
    /// The rustls client configuration these settings describe (aws-lc-rs provider, TLS 1.2 and 1.3).
    ///
    /// # Errors
    /// [`Config`](crate::ErrorKind::Config) naming the file when a CA file, certificate or key cannot be read or holds
    /// nothing usable, or when the system trust store is empty.
    pub fn client_config(&self) -> Result<ClientConfig> {
        let provider = Arc::new(aws_lc_rs::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error(format!("no usable TLS protocol version: {e}")))?;
        let verifier: Arc<dyn ServerCertVerifier> = match self.server_check {
            ServerCheck::Off => Arc::new(NoServerCheck(provider)),
            check => {
                let webpki =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(self.roots()?), provider)
                        .build()
                        .map_err(|e| {
                            tls_error(format!("cannot build the certificate verifier: {e}"))
                        })?;
                if check == ServerCheck::Full {
                    webpki
                } else {
                    Arc::new(ChainOnly(webpki))
                }
            }
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &self.client_identity {
            None => builder.with_no_client_auth(),
            Some((cert_file, key_file)) => {
                let chain = CertificateDer::pem_file_iter(cert_file)
                    .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                    .map_err(|e| file_error("client certificate", cert_file, e))?;
                if chain.is_empty() {
                    return Err(useless_file(
                        "client certificate",
                        cert_file,
                        "no CERTIFICATE",
                    ));
                }
                let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| {
                    file_error(
                        "client key (PEM, unencrypted PKCS#8, PKCS#1 or SEC1)",
                        key_file,
                        e,
                    )
                })?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    tls_error(format!(
                        "the client certificate {} and key {} do not form an identity: {e}",
                        cert_file.display(),
                        key_file.display()
                    ))
                })?
            }
        };
        Ok(config)
    }

    fn roots(&self) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        match &self.ca_file {
            Some(path) => {
                let certs = CertificateDer::pem_file_iter(path)
                    .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                    .map_err(|e| file_error("CA file", path, e))?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(useless_file("CA file", path, "no usable CA certificate"));
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                for e in &native.errors {
                    tracing::warn!(error = %e, "skipping part of the system trust store");
                }
                let (added, _) = roots.add_parsable_certificates(native.certs);
                if added == 0 {
                    return Err(tls_error(
                        "the system trust store has no CA certificates; name a CA file".into(),
                    ));
                }
            }
        }
        Ok(roots)
    }
}

/// Checks the chain, accepts a certificate issued for another name.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Accepts any certificate; still checks that the server holds its key (handshake signatures).
#[derive(Debug)]
struct NoServerCheck(Arc<CryptoProvider>);

impl ServerCertVerifier for NoServerCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_ca_file_is_named() {
        let settings = TlsSettings {
            ca_file: Some("/nonexistent/ratchet-ca.pem".into()),
            ..TlsSettings::default()
        };
        let err = settings.client_config().unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Config);
        assert!(
            err.to_string().contains("/nonexistent/ratchet-ca.pem"),
            "{err}"
        );
    }

    #[test]
    fn a_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let settings = TlsSettings {
            ca_file: Some(path),
            ..TlsSettings::default()
        };
        let err = settings.client_config().unwrap_err();
        assert!(
            err.to_string().contains("no usable CA certificate"),
            "{err}"
        );
    }
}
