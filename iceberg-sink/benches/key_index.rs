//! The upsert mode's key index (`upsert_deletes = "position"`): its memory per million keys and how long a
//! recovery takes to rebuild it from the table.
//!
//! For each key count (`RATCHET_BENCH_KEYS`, default `1000000,4000000`) it upserts that many `bigint` ids into a
//! fresh table (SQLite catalog, local warehouse) in two checkpoints (every id, then every second id again, so the
//! table holds position deletes the rebuild applies), drops the sink, and recovers a second one on the table:
//! the time `recover` takes (the epoch raise and the rebuild), and the heap the index holds afterwards as
//! `IcebergSink::key_index_bytes` computes it from its tables' capacities (each allocation rounded up as glibc's
//! malloc does), so bytes per key include the hash table's empty slots and the allocator's overhead.
//!
//! Run: `scripts/services.sh up && cargo bench -p iceberg-sink --bench key_index` (see docs/benchmarks.md).
#![allow(clippy::disallowed_methods)] // benches read their modes from the environment

mod lake;

use std::time::Instant;

use connector_api::{CheckpointId, Committer, TwoPhaseCommit};
use iceberg_sink::{IcebergSink, IcebergSinkConfig};
use ratchet_conformance::conformance_batch_with;

/// Rows per written batch.
const BATCH_ROWS: i64 = 65_536;

/// Upserts ids `ids` (step `step`) as checkpoint `checkpoint` and commits it.
async fn upsert(sink: &mut IcebergSink, checkpoint: u64, ids: std::ops::Range<i64>, step: usize) {
    sink.begin(CheckpointId(checkpoint)).await.unwrap();
    let ids: Vec<i64> = ids.step_by(step).collect();
    for chunk in ids.chunks(BATCH_ROWS as usize) {
        let batch = conformance_batch_with(0..chunk.len() as i64, |i| format!("v{i}"));
        let mut columns = batch.columns().to_vec();
        columns[0] = std::sync::Arc::new(arrow_array::Int64Array::from(chunk.to_vec()));
        let batch = arrow_array::RecordBatch::try_new(batch.schema(), columns).unwrap();
        sink.write(&batch).await.unwrap();
    }
    let committable = sink.pre_commit(CheckpointId(checkpoint)).await.unwrap();
    sink.committer().commit(vec![committable]).await.unwrap();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    test_support::Services::get();
    let counts: Vec<i64> = std::env::var("RATCHET_BENCH_KEYS")
        .unwrap_or_else(|_| "1000000,4000000".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("RATCHET_BENCH_KEYS: comma-separated key counts")
        })
        .collect();
    println!(
        "| keys | rebuild (recover) s | index heap MB | bytes per key | MB per million keys |\n|---|---|---|---|---|"
    );
    for keys in counts {
        let lake = lake::lake();
        let config = IcebergSinkConfig {
            upsert_key: vec!["id".into()],
            ..lake::config(&lake)
        };
        let mut writer = IcebergSink::new(config.clone()).await.unwrap();
        writer.recover(None).await.unwrap();
        upsert(&mut writer, 1, 0..keys, 1).await;
        upsert(&mut writer, 2, 0..keys, 2).await;
        drop(writer);
        let mut sink = IcebergSink::new(config).await.unwrap();
        let started = Instant::now();
        sink.recover(None).await.unwrap();
        let seconds = started.elapsed().as_secs_f64();
        let held = sink.key_index_bytes().unwrap();
        assert_eq!(
            sink.indexed_keys(),
            Some(keys as usize),
            "every key indexed once"
        );
        println!(
            "| {keys} | {seconds:.2} | {:.1} | {:.0} | {:.0} |",
            held as f64 / 1e6,
            held as f64 / keys as f64,
            held as f64 / keys as f64
        );
    }
}
