//! The conformance harness on the file sink, on local disk and on SeaweedFS S3, verified from Python (pyarrow and
//! boto3 read only what is visible), including that nothing staged is left once recovery has run.

use crate::common;

use async_trait::async_trait;
use common::{Place, config};
use connector_api::{Result, SinkId, SubtaskId};
use file_sink::FileSink;
use ratchet_conformance::{Conformance, ConformanceTarget, run_conformance};

struct Files(Place);

fn sub(run: &str, sink: &SinkId) -> String {
    format!("{run}/{sink}")
}

#[async_trait]
impl ConformanceTarget for Files {
    type Sink = FileSink;

    async fn create_sink(&self, run: &str, sink: &SinkId, subtask: SubtaskId) -> Result<FileSink> {
        let mut config = config(&self.0, &sub(run, sink), sink);
        config.subtask = subtask;
        FileSink::new(config).await
    }

    async fn visible_ids(&self, run: &str, sink: &SinkId) -> Result<Vec<i64>> {
        let (place, sub) = (self.0.clone(), sub(run, sink));
        Ok(
            tokio::task::spawn_blocking(move || place.read(&sub, "id").0)
                .await
                .unwrap(),
        )
    }

    async fn leftovers(&self, run: &str, sink: &SinkId) -> Result<Vec<String>> {
        let (place, sub) = (self.0.clone(), sub(run, sink));
        Ok(
            tokio::task::spawn_blocking(move || place.read(&sub, "id").2)
                .await
                .unwrap(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_files_pass_the_conformance_harness() {
    let (place, _dir) = Place::local();
    run_conformance(
        "file-sink on local disk",
        &Files(place),
        &Conformance::default(),
    )
    .await
    .assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_files_pass_the_conformance_harness() {
    let place = Place::s3("conformance");
    let config = Conformance {
        records: 200,
        random_records: 600,
        ..Conformance::default()
    };
    run_conformance("file-sink on SeaweedFS S3", &Files(place), &config)
        .await
        .assert_passed();
}
