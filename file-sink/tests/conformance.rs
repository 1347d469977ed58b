//! The conformance harness on the local-filesystem Parquet sink, verified from Python: pyarrow reads only the
//! visible files.

use std::path::PathBuf;

use async_trait::async_trait;
use connector_api::{Result, SinkId, SubtaskId};
use file_sink::{LocalParquetSink, LocalParquetSinkConfig};
use integration::Services;
use integration::conformance::{
    Conformance, ConformanceTarget, conformance_schema, run_conformance,
};

struct LocalFiles {
    base: PathBuf,
}

impl LocalFiles {
    fn dir(&self, run: &str, sink: &SinkId) -> PathBuf {
        self.base.join(run).join(sink.as_str())
    }
}

#[async_trait]
impl ConformanceTarget for LocalFiles {
    type Sink = LocalParquetSink;

    async fn create_sink(&self, run: &str, sink: &SinkId) -> Result<LocalParquetSink> {
        LocalParquetSink::new(LocalParquetSinkConfig {
            sink: sink.clone(),
            subtask: SubtaskId(0),
            dir: self.dir(run, sink),
            schema: conformance_schema(),
        })
    }

    async fn visible_ids(&self, run: &str, sink: &SinkId) -> Result<Vec<i64>> {
        let dir = self.dir(run, sink).display().to_string();
        let seen = tokio::task::spawn_blocking(move || {
            Services::get().verify("parquet_ids.py", &[&dir, "id"])
        })
        .await
        .expect("verifier task");
        Ok(seen["ids"]
            .as_array()
            .expect("ids array")
            .iter()
            .map(|v| v.as_i64().expect("integer id"))
            .collect())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_parquet_sink_passes_the_conformance_harness() {
    let base = tempfile::tempdir().unwrap();
    let target = LocalFiles {
        base: base.path().to_path_buf(),
    };
    run_conformance(
        "file-sink (local Parquet)",
        &target,
        &Conformance::default(),
    )
    .await
    .assert_passed();
}
