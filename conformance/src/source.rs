//! The harness's replayable source: records with ids `0..n`, in seeded random batches.

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use connector_api::SourceOffset;

/// Topic name the harness reports its positions under.
pub(crate) const TOPIC: &str = "conformance";

/// The schema of every batch the harness writes: `id` (the record's identity, what the verifier counts) and a
/// `payload` derived from it.
pub fn conformance_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("payload", DataType::Utf8, false),
    ]))
}

/// A batch of [`conformance_schema`] holding records `ids` (payload `record-<id>`).
pub fn conformance_batch(ids: std::ops::Range<i64>) -> RecordBatch {
    conformance_batch_with(ids, |i| format!("record-{i}"))
}

/// A batch of [`conformance_schema`] holding records `ids` with payloads from `payload` (to control record size
/// in benchmarks and size-dependent tests).
pub fn conformance_batch_with(
    ids: std::ops::Range<i64>,
    payload: impl Fn(i64) -> String,
) -> RecordBatch {
    let payloads: Vec<String> = ids.clone().map(payload).collect();
    RecordBatch::try_new(
        conformance_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids)),
            Arc::new(StringArray::from_iter_values(payloads)),
        ],
    )
    .expect("batch matches schema")
}

/// The harness source's positions after reading records `0..next` (its one partition): what tests that run the
/// driver by hand checkpoint at.
pub fn conformance_positions(next: i64) -> Vec<SourceOffset> {
    vec![SourceOffset::new(TOPIC, 0, next)]
}

/// Where restored positions say to resume.
pub(crate) fn resume_offset(positions: &[SourceOffset]) -> i64 {
    positions
        .iter()
        .find(|p| p.topic == TOPIC && p.partition == 0)
        .map_or(0, |p| p.next_offset)
}

/// A small deterministic generator (SplitMix64): the same seed gives the same batches and crash points.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` > 0).
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }
}
