//! Transforms: stateless SQL over each Arrow batch between the source and the sinks, planned by Apache
//! DataFusion.
//!
//! A [`Transform`] is one `SELECT ... FROM input ...` planned once against the schema of the batches it will be
//! given (the table `input`), and applied to every batch. Only what is a function of one row or of one batch is
//! allowed: projection, rename, cast, filter, computed columns, `CASE`, string, regex, date, hashing and JSON
//! functions, nested field access, `unnest`, struct building, `UNION ALL`. Because the output depends on nothing
//! but the input batch, exactly-once holds by construction: a batch replayed after a crash gives the same rows.
//!
//! Refused when planned ([`Transform::sql`]), naming the expression:
//! - non-deterministic functions (`random()`, `uuid()`, `now()`, `current_date`, ...): a replay would write
//!   different values than the first attempt;
//! - aggregates, window functions, `DISTINCT`, joins and subqueries, `ORDER BY`, `LIMIT`: they span batches (or
//!   depend on how records happen to be batched) and need state this crate does not keep (planned);
//! - anything but one `SELECT` over `input` (DDL, DML, `VALUES`, `EXPLAIN`).
//!
//! A row whose expression fails (a cast that does not fit, a JSON path into a non-object) fails the batch; a
//! [`Pipeline`] finds the failing rows by halving the batch ([`Pipeline::apply_isolating`]), so the other rows go
//! on and each failure names the transform, the expression and the row.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Int64Array, RecordBatch, StringArray};
//! use arrow_schema::{DataType, Field, Schema};
//! use transform::Transform;
//!
//! let schema = Arc::new(Schema::new(vec![
//!     Field::new("id", DataType::Int64, false),
//!     Field::new("email", DataType::Utf8, true),
//! ]));
//! let mask = Transform::sql(
//!     "mask",
//!     "SELECT id, encode(sha256(email), 'hex') AS email_hash FROM input WHERE id > 1",
//!     schema.clone(),
//! )?;
//! let batch = RecordBatch::try_new(schema, vec![
//!     Arc::new(Int64Array::from(vec![1, 2])),
//!     Arc::new(StringArray::from(vec![Some("a@example.com"), Some("b@example.com")])),
//! ])?;
//! let out = mask.apply(&batch)?;
//! assert_eq!(out.num_rows(), 1);
//! assert_eq!(out.schema().field(1).name(), "email_hash");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod failure;
mod origin;
mod pipeline;
mod plan;
mod rules;
mod steps;

pub use failure::Failure;
pub use pipeline::{Isolated, Pipeline, RowFailure};
pub use plan::{INPUT_TABLE, Transform};
