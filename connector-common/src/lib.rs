//! Infrastructure shared by Ratchet's sinks, its checkpoint stores and the `ratchet` worker: nothing here is part
//! of the two-phase-commit contract (that is `connector-api`), so a sink that needs none of it compiles none of it.
//!
//! | module | what | feature |
//! |---|---|---|
//! | [`fs`] | crash-safe local files: an exclusive lock, atomic replace, a synced directory | always |
//! | [`config`] | "did you mean" for misspelt keys, and the one rule for showing a URL without its password | always |
//! | [`secret`] | [`Secret<T>`](secret::Secret): a value that never appears in `Debug`, `Display` or logs | always |
//! | [`s3`] | static S3 credentials, checked the same way by every sink that writes to S3 | always |
//! | `tls` | rustls client configurations from CA files and client certificates | `tls` |
//! | `postgres` | PostgreSQL connections from libpq URLs, bounded and kept alive | `postgres` |
//!
//! Errors are this crate's own [`Error`], with a [`kind`](Error::kind) saying whether the configuration is wrong
//! or the server could not be reached; `connector-api` turns them into its protocol errors.
#![deny(missing_docs)]

pub mod config;
mod error;
pub mod fs;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod s3;
pub mod secret;
#[cfg(feature = "tls")]
pub mod tls;

pub use error::{Error, ErrorKind, Result};
pub use secret::Secret;
