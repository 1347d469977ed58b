//! The CPU a transform adds per record, without Kafka or a sink: `Pipeline::apply` over 8,192-row batches of the
//! worker benchmark's columns (`order`, `customer`, `amount` longs and a 40-character `note`), for the transforms
//! docs/benchmarks.md names; the same batches through an empty pipeline as the floor. Prints a table. (A bench of
//! the worker, not of the `transform` crate: built with the worker's features, it reuses the worker's release build.)
//!
//! Run: `cargo bench -p worker --bench transform_apply` (`RATCHET_BENCH_BATCHES` batches per transform, default 500).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

use std::sync::Arc;
use std::time::Instant;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use transform::{Pipeline, Transform};

const ROWS: usize = 8192;

const TRANSFORMS: &[(&str, &str)] = &[
    ("none (empty pipeline)", ""),
    (
        "projection + filter + cast",
        "SELECT \"order\", customer, CAST(amount AS DECIMAL(12, 2)) AS amount, note FROM input \
         WHERE customer >= 0 AND \"order\" >= 0",
    ),
    (
        "+ decimal division and upper()",
        "SELECT \"order\", customer, CAST(amount AS DECIMAL(12, 2)) / 100 AS amount, upper(note) AS note \
         FROM input WHERE customer >= 0 AND \"order\" >= 0",
    ),
    (
        "sha256 of a column (masking)",
        "SELECT \"order\", customer, amount, encode(sha256(note), 'hex') AS note FROM input",
    ),
    (
        "filter keeping 10%",
        "SELECT * FROM input WHERE customer % 10 = 0",
    ),
];

fn main() {
    let batches: usize = std::env::var("RATCHET_BENCH_BATCHES")
        .map(|b| b.parse().expect("RATCHET_BENCH_BATCHES: a count"))
        .unwrap_or(500);
    let schema = Arc::new(Schema::new(vec![
        Field::new("order", DataType::Int64, true),
        Field::new("customer", DataType::Int64, true),
        Field::new("amount", DataType::Int64, true),
        Field::new("note", DataType::Utf8, true),
    ]));
    let note = "x".repeat(40);
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..ROWS as i64)),
            Arc::new(Int64Array::from_iter_values(
                (0..ROWS as i64).map(|i| i % 99_991),
            )),
            Arc::new(Int64Array::from_iter_values(
                (0..ROWS as i64).map(|i| i % 100_000),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..ROWS).map(|_| note.as_str()),
            )),
        ],
    )
    .unwrap();
    println!("\n{batches} batches of {ROWS} rows per transform, one thread:\n");
    println!("| transform | records/s | ns per record |");
    println!("|---|---|---|");
    for (title, sql) in TRANSFORMS {
        let stages = match sql.is_empty() {
            true => Vec::new(),
            false => vec![Arc::new(
                Transform::sql("bench", sql, schema.clone()).unwrap(),
            )],
        };
        let pipeline = Pipeline::new(schema.clone(), stages).unwrap();
        let started = Instant::now();
        let mut kept = 0;
        for _ in 0..batches {
            kept += pipeline.apply(&batch).unwrap().num_rows();
        }
        let seconds = started.elapsed().as_secs_f64();
        let records = (batches * ROWS) as f64;
        assert!(kept > 0);
        println!(
            "| {title} | {:.0} | {:.1} |",
            records / seconds,
            seconds * 1e9 / records
        );
    }
}
