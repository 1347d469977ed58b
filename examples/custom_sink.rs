//! Writing a sink: JSON lines files in a directory, exactly once, proved with Ratchet's conformance harness.
//!
//! The protocol, per checkpoint N (see `connector_api::TwoPhaseCommit`):
//! - `write` appends rows to `.stage-<subtask>-<epoch>-<N>.jsonl` (hidden: readers skip dot files);
//! - `pre_commit` fsyncs it; the committable names it;
//! - `commit` renames it to `part-<subtask>-<N>.jsonl` (a rename is atomic; renaming again finds the target there
//!   and does nothing), unless a newer instance has recovered since (the owner epoch in `.owner-<subtask>`);
//! - `recover` raises the owner epoch (fencing older instances), commits the restored files, and deletes every
//!   other stage file of this subtask.
//!
//! `cargo run -p ratchet-examples --example custom_sink` runs the harness (no server needed) and prints the table.
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use async_trait::async_trait;
use connector_api::{
    CheckpointId, Committer, Error, ErrorKind, Fence, FenceOrder, Phase, RecoveryPlan, Result,
    SinkId, SubtaskId, TwoPhaseCommit,
};
use ratchet_conformance::{Conformance, ConformanceTarget, run_conformance};
use serde::{Deserialize, Serialize};

/// A staged file waiting for its checkpoint's commit.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Staged {
    stage: PathBuf,
    visible: PathBuf,
}

/// JSON lines into a directory, one file per checkpoint.
struct LinesSink {
    id: SinkId,
    dir: PathBuf,
    epoch: u64,
    open: Option<(CheckpointId, File, PathBuf)>,
}

#[derive(Clone)]
struct LinesCommitter {
    id: SinkId,
    dir: PathBuf,
    epoch: u64,
}

fn io(phase: Phase, what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::new(ErrorKind::Retryable, phase, what.to_string()).with_source(e)
}

fn owner_epoch(dir: &Path) -> u64 {
    fs::read_to_string(dir.join(".owner-0"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

#[async_trait]
impl Committer for LinesCommitter {
    type Committable = Option<Staged>;

    async fn commit(&self, committables: Vec<Option<Staged>>) -> Result<()> {
        for staged in committables.into_iter().flatten() {
            if owner_epoch(&self.dir) > self.epoch {
                return Err(Error::new(
                    ErrorKind::Fenced,
                    Phase::Commit,
                    "a newer instance recovered",
                )
                .with_sink(&self.id));
            }
            match fs::rename(&staged.stage, &staged.visible) {
                Ok(()) => {}
                // Committed before: the stage is gone and the file is in place.
                Err(_) if staged.visible.exists() => {}
                Err(e) => return Err(io(Phase::Commit, "cannot publish a file")(e)),
            }
        }
        Ok(())
    }

    async fn is_committed(&self, staged: &Option<Staged>) -> Result<bool> {
        Ok(staged.as_ref().is_none_or(|s| s.visible.exists()))
    }
}

#[async_trait]
impl TwoPhaseCommit for LinesSink {
    type Committable = Option<Staged>;
    type Committer = LinesCommitter;

    fn sink_id(&self) -> &SinkId {
        &self.id
    }

    fn committer(&self) -> LinesCommitter {
        LinesCommitter {
            id: self.id.clone(),
            dir: self.dir.clone(),
            epoch: self.epoch,
        }
    }

    async fn begin(&mut self, checkpoint: CheckpointId) -> Result<()> {
        let stage = self
            .dir
            .join(format!(".stage-0-{}-{checkpoint}.jsonl", self.epoch));
        let file = File::create(&stage).map_err(io(Phase::Begin, "cannot create a stage file"))?;
        self.open = Some((checkpoint, file, stage));
        Ok(())
    }

    async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let (_, file, _) = self
            .open
            .as_mut()
            .ok_or_else(|| Error::new(ErrorKind::Bug, Phase::Write, "write before begin"))?;
        let ids = batch
            .column_by_name("id")
            .and_then(|c| c.as_primitive_opt::<Int64Type>())
            .ok_or_else(|| {
                Error::new(ErrorKind::BadRecord, Phase::Write, "no Int64 column \"id\"")
            })?;
        let mut lines = String::new();
        for id in ids.values() {
            lines.push_str(&format!("{{\"id\":{id}}}\n"));
        }
        file.write_all(lines.as_bytes())
            .map_err(io(Phase::Write, "cannot append"))
    }

    async fn pre_commit(&mut self, checkpoint: CheckpointId) -> Result<Option<Staged>> {
        let (_, file, stage) = self
            .open
            .take()
            .ok_or_else(|| Error::new(ErrorKind::Bug, Phase::PreCommit, "nothing open"))?;
        file.sync_all()
            .map_err(io(Phase::PreCommit, "cannot fsync"))?;
        Ok(Some(Staged {
            stage,
            visible: self.dir.join(format!("part-0-{checkpoint}.jsonl")),
        }))
    }

    async fn abort(&mut self) -> Result<()> {
        if let Some((_, _, stage)) = self.open.take() {
            let _ = fs::remove_file(stage);
        }
        Ok(())
    }

    /// What recovery will do: publish the restored files not visible yet (found by the committer's
    /// `is_committed`), after raising the owner epoch; every other stage is deleted.
    async fn plan_recovery(
        &mut self,
        restored: Option<(CheckpointId, Vec<Option<Staged>>)>,
    ) -> Result<RecoveryPlan<Option<Staged>>> {
        let fence = Fence {
            order: FenceOrder::BeforeCommit,
            how: "raise the owner epoch in .owner-0".into(),
        };
        RecoveryPlan::checking(&self.committer(), restored, fence).await
    }

    async fn execute_recovery(&mut self, plan: RecoveryPlan<Option<Staged>>) -> Result<()> {
        self.epoch = owner_epoch(&self.dir) + 1;
        fs::write(self.dir.join(".owner-0"), self.epoch.to_string())
            .map_err(io(Phase::Recover, "cannot write the owner epoch"))?;
        self.committer().commit(plan.commit).await?;
        for entry in fs::read_dir(&self.dir).map_err(io(Phase::Recover, "cannot list"))? {
            let path = entry.map_err(io(Phase::Recover, "cannot list"))?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name.starts_with(".stage-0-") {
                fs::remove_file(&path).map_err(io(Phase::Recover, "cannot delete a stage"))?;
            }
        }
        Ok(())
    }
}

/// The harness target: one directory per run and sink, read back by listing the visible files.
struct Lines(PathBuf);

impl Lines {
    fn dir(&self, run: &str, sink: &SinkId) -> PathBuf {
        self.0.join(run).join(sink.as_str())
    }
}

#[async_trait]
impl ConformanceTarget for Lines {
    type Sink = LinesSink;

    async fn create_sink(&self, run: &str, sink: &SinkId, _: SubtaskId) -> Result<LinesSink> {
        let dir = self.dir(run, sink);
        fs::create_dir_all(&dir).map_err(io(Phase::Setup, "cannot create the directory"))?;
        Ok(LinesSink {
            id: sink.clone(),
            dir,
            epoch: 0,
            open: None,
        })
    }

    async fn visible_ids(&self, run: &str, sink: &SinkId) -> Result<Vec<i64>> {
        let mut ids = Vec::new();
        for entry in fs::read_dir(self.dir(run, sink)).map_err(io(Phase::Setup, "cannot list"))? {
            let path = entry.map_err(io(Phase::Setup, "cannot list"))?.path();
            if path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .starts_with("part-")
            {
                let text = fs::read_to_string(&path).map_err(io(Phase::Setup, "cannot read"))?;
                for line in text.lines() {
                    let row: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                        Error::new(ErrorKind::Fatal, Phase::Setup, "a damaged line").with_source(e)
                    })?;
                    ids.push(row["id"].as_i64().unwrap_or(-1));
                }
            }
        }
        Ok(ids)
    }

    async fn leftovers(&self, run: &str, sink: &SinkId) -> Result<Vec<String>> {
        Ok(fs::read_dir(self.dir(run, sink))
            .map_err(io(Phase::Setup, "cannot list"))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|name| name.starts_with(".stage-"))
            .collect())
    }
}

/// Runs the conformance harness on the example sink; exits non-zero when a scenario fails.
#[tokio::main]
pub async fn main() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let report = run_conformance(
        "JSON lines example sink",
        &Lines(dir.path().to_path_buf()),
        &Conformance::default(),
    )
    .await;
    if !report.passed() {
        eprintln!("the example sink failed the harness");
        std::process::exit(1);
    }
}
