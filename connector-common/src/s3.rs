//! Static S3 credentials, shared by every sink that writes to S3 (the file sink's bucket, an Iceberg warehouse).

use crate::{Error, Result, Secret};

/// An access key pair given in the configuration. Without one, clients use the standard AWS credential chain
/// (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, profiles, instance metadata).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Credentials {
    /// The access key id (not secret: it names the key, and is shown in logs).
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: Secret<String>,
}

impl S3Credentials {
    /// The pair from the two optional settings `access_key_id` and `secret_access_key`: both (static credentials),
    /// or neither (`None`: the AWS chain).
    ///
    /// # Errors
    /// [`Config`](crate::ErrorKind::Config) when only one of the two is set: half a pair is a mistake that would
    /// otherwise silently fall back to whatever credentials the environment has.
    pub fn from_settings(
        access_key_id: Option<&str>,
        secret_access_key: Option<&Secret<String>>,
    ) -> Result<Option<Self>> {
        match (access_key_id, secret_access_key) {
            (Some(id), Some(secret)) => Ok(Some(Self {
                access_key_id: id.to_string(),
                secret_access_key: secret.clone(),
            })),
            (None, None) => Ok(None),
            (Some(_), None) => Err(Error::config(
                "access_key_id is set without secret_access_key: set both, or neither (to use the AWS credential chain)",
            )),
            (None, Some(_)) => Err(Error::config(
                "secret_access_key is set without access_key_id: set both, or neither (to use the AWS credential chain)",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_keys_or_neither() {
        let secret = Secret::new("s".to_string());
        let pair = S3Credentials::from_settings(Some("AKIA"), Some(&secret))
            .unwrap()
            .unwrap();
        assert_eq!(pair.access_key_id, "AKIA");
        assert!(!format!("{pair:?}").contains("\"s\""));
        assert_eq!(S3Credentials::from_settings(None, None).unwrap(), None);
        let half = S3Credentials::from_settings(Some("AKIA"), None).unwrap_err();
        assert!(half.message().contains("set both"), "{half}");
        assert!(S3Credentials::from_settings(None, Some(&secret)).is_err());
    }
}
