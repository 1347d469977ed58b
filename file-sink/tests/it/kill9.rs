//! Real `kill -9` at every protocol step, on local disk and on SeaweedFS S3, through the conformance kit's runner
//! ([`KillNine`]): a child process runs a job and sends itself SIGKILL at the step; the parent then recovers (a new
//! driver and sink), and checks with the Python verifier that exactly the restored checkpoint's records are
//! visible, each once, and that no in-progress file, spill file, staged object or open multipart upload is left;
//! then the job goes on and a final recovery leaves every record once.

use crate::common;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use common::{Place, config};
use connector_api::{Result, SinkId, Step};
use file_sink::{FileSink, FormatConfig};
use ratchet_conformance::conformance_batch_with;
use ratchet_conformance::kill9::{KillNine, KillTarget, KilledRun};

/// ~9 MB of JSON per checkpoint (3 batches of 3,000 records of 1 kB), so S3 files go multipart and a part is
/// uploaded before the checkpoint ends.
const KILL9: KillNine = KillNine {
    batches: 3,
    rows: 3000,
    batch: rows,
    ..KillNine::new("kill9::child", "RATCHET_FILE_KILL9_CHILD")
};

fn rows(ids: std::ops::Range<i64>) -> RecordBatch {
    conformance_batch_with(ids, |i| format!("{i:0>1000}"))
}

/// The file sink on local disk (under the run's directory) or under an S3 prefix named after the run.
struct Files {
    s3: bool,
}

impl Files {
    fn of(variant: &str) -> Files {
        Files {
            s3: variant == "s3",
        }
    }

    fn place(&self, run: &KilledRun) -> Place {
        if self.s3 {
            Place::S3 {
                prefix: format!("file-sink-tests/{}", run.name),
            }
        } else {
            Place::Local(run.dir.join("out"))
        }
    }

    /// Visible ids, and what is staged or in progress.
    async fn read(&self, run: &KilledRun) -> (Vec<i64>, Vec<String>) {
        let place = self.place(run);
        let (ids, _, strays) = tokio::task::spawn_blocking(move || place.read("job", "id"))
            .await
            .expect("the verifier's task");
        (ids, strays)
    }
}

#[async_trait]
impl KillTarget for Files {
    type Sink = FileSink;

    async fn create_sink(&self, run: &KilledRun) -> Result<FileSink> {
        let mut config = config(&self.place(run), "job", &SinkId::new("killed")?);
        config.format = FormatConfig::JsonLines;
        FileSink::new(config).await
    }

    async fn visible_ids(&self, run: &KilledRun) -> Result<Vec<i64>> {
        Ok(self.read(run).await.0)
    }

    async fn leftovers(&self, run: &KilledRun) -> Result<Vec<String>> {
        Ok(self.read(run).await.1)
    }

    /// A crash before the commit started leaves staged data: the recovery under test is about cleaning it up.
    /// (Killed on the commit task, the commit may have finished and the next checkpoint's data still be in
    /// memory: nothing to require there.)
    async fn crash_problems(&self, run: &KilledRun) -> Result<Vec<String>> {
        let staged_for_sure = matches!(
            run.step,
            Step::AfterWrite | Step::AfterPreCommit | Step::AfterRecordDurable
        );
        let (_, strays) = self.read(run).await;
        Ok(if staged_for_sure && strays.is_empty() {
            vec!["expected staged leftovers before recovery, found none".into()]
        } else {
            Vec::new()
        })
    }
}

/// The child's entry point (returns at once in a normal test run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    if let Some(run) = KILL9.child_run() {
        KILL9.run_child(&Files::of(&run.variant), run).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_every_step_on_local_disk() {
    KILL9.every_step(&Files::of("local"), "local").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_every_step_on_s3() {
    KILL9.every_step(&Files::of("s3"), "s3").await;
}
