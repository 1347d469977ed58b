//! Values that must never be printed: passwords, secret keys, tokens.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// What is shown in place of a secret value.
pub const REDACTED: &str = "<redacted>";

/// A value that never appears in `Debug` or `Display` output (both print [`REDACTED`]), so a config struct that
/// holds one can derive `Debug` and be logged whole. Read it with [`Secret::expose`], at the one place that hands
/// it to a client library.
///
/// It deserializes from the bare value (`secret_access_key = "…"`), so it is a drop-in field type for settings.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    /// Wraps `value`.
    pub fn new(value: T) -> Self {
        Self(value)
    }

    /// The value itself: pass it to the client that needs it and nowhere else.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> From<T> for Secret<T> {
    fn from(value: T) -> Self {
        Self(value)
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Secret<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Settings {
        user: String,
        password: Secret<String>,
    }

    #[test]
    fn a_secret_reads_like_its_value_and_never_prints() {
        let settings: Settings =
            serde_json::from_value(serde_json::json!({"user": "u", "password": "hunter2"}))
                .unwrap();
        assert_eq!(settings.password.expose(), "hunter2");
        let shown = format!("{settings:?} {}", settings.password);
        assert!(
            !shown.contains("hunter2") && shown.contains(REDACTED),
            "{shown}"
        );
        assert_eq!(settings.user, "u");
    }
}
