//! Job files for the benchmarks that run the `ratchet` binary (`run.rs`, `latency.rs`), and running workers on
//! them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use test_support::Services;

use super::runs::{Stopped, stopped_line};
use super::{PRODUCER, bootstrap};

/// Where the job's checkpoint store lives.
#[derive(Debug, Clone, Copy)]
pub enum Store {
    /// A directory under the job's directory.
    Local,
    /// The test PostgreSQL.
    Postgres,
}

/// One benchmark job: Kafka `topic` (read as text) into one sink of `kind` (`file`, `kafka`, `jdbc`,
/// `iceberg`).
#[derive(Debug, Clone, Copy)]
pub struct JobFile<'a> {
    pub topic: &'a str,
    pub kind: &'a str,
    pub delivery: &'a str,
    pub store: Store,
    pub subtasks: i32,
    /// `checkpoint_interval`, as the job file spells it (`"1s"`, `"100ms"`).
    pub checkpoint_interval: &'a str,
    /// The Iceberg sink's `commit_every`.
    pub commit_every: u32,
}

/// A written job file and the name its sink's output is derived from.
#[derive(Debug, Clone)]
pub struct Written {
    pub path: PathBuf,
    /// The job's name: the Kafka sink writes topic `<name>-out`, the JDBC sink table `<name>`, the Iceberg sink
    /// table `bench.<name>`; the file sink writes under `<dir>/out`.
    pub name: String,
}

impl<'a> JobFile<'a> {
    /// `topic` into a sink of `kind`, exactly-once, local store, 3 subtasks, 1 s checkpoints, a snapshot per
    /// checkpoint.
    pub fn new(topic: &'a str, kind: &'a str) -> Self {
        Self {
            topic,
            kind,
            delivery: "exactly-once",
            store: Store::Local,
            subtasks: 3,
            checkpoint_interval: "1s",
            commit_every: 1,
        }
    }

    /// Writes the job file into `dir`.
    pub fn write(&self, dir: &Path, services: &Services) -> Written {
        let name = test_support::unique_name("bench-run").replace('-', "_");
        let client: Vec<String> = PRODUCER
            .iter()
            .map(|(k, v)| format!("\"{k}\" = \"{v}\""))
            .collect();
        let sink = match self.kind {
            "file" => format!(
                "storage = {{ kind = \"local\", path = \"{}\" }}\nformat = {{ kind = \"parquet\", compression = \"zstd\" }}",
                dir.join("out").display()
            ),
            "kafka" => format!(
                "bootstrap_servers = \"{}\"\ntopic = \"{name}-out\"\ntransactional_id_prefix = \"{name}\"\n\
                 records = {{ key_column = \"key\", value_column = \"value\" }}\nclient = {{ {} }}",
                bootstrap(),
                client.join(", ")
            ),
            "jdbc" => format!(
                "url = \"{}\"\ntable = \"{name}\"\nscope = \"{name}\"\ncreate_table = true",
                services.pg_url()
            ),
            "iceberg" => format!(
                "catalog = {{ kind = \"sql\", uri = \"{uri}\", warehouse = \"{warehouse}\" }}\n\
                 table = \"bench.{name}\"\ncreate_table = true\ncommit_every = {}",
                self.commit_every,
                uri = iceberg_catalog_uri(dir),
                warehouse = iceberg_warehouse(dir),
            ),
            other => panic!("unknown sink kind {other}"),
        };
        let store = match self.store {
            Store::Local => format!(
                "kind = \"local\"\npath = \"{}\"",
                dir.join("state").display()
            ),
            Store::Postgres => format!("kind = \"postgres\"\nurl = \"{}\"", services.pg_url()),
        };
        let text = format!(
            "[job]\nname = \"{name}\"\nsubtasks = {subtasks}\ncheckpoint_interval = \"{interval}\"\nlease = \"5s\"\n\n\
             [source]\nbootstrap_servers = \"{bootstrap}\"\ntopic = \"{topic}\"\n\n[store]\n{store}\n\n\
             [[sinks]]\ntype = \"{kind}\"\nid = \"out\"\ndelivery = \"{delivery}\"\n{sink}\n",
            subtasks = self.subtasks,
            interval = self.checkpoint_interval,
            bootstrap = bootstrap(),
            topic = self.topic,
            kind = self.kind,
            delivery = self.delivery,
        );
        let path = dir.join("job.toml");
        std::fs::write(&path, text).unwrap();
        Written { path, name }
    }
}

/// The Iceberg sink's SQLite catalog under the job's directory.
pub fn iceberg_catalog_uri(dir: &Path) -> String {
    format!("sqlite://{}/catalog.db?mode=rwc", dir.display())
}

/// The Iceberg sink's local warehouse under the job's directory.
pub fn iceberg_warehouse(dir: &Path) -> String {
    format!("file://{}/warehouse", dir.display())
}

/// Starts one worker on `job` (`ratchet run`, JSON logs on its stderr), stopping by itself once idle for
/// `exit_when_idle` when given.
pub fn spawn_worker(job: &Path, exit_when_idle: Option<&str>) -> Child {
    let mut args = vec!["--log-format", "json", "run"];
    if let Some(idle) = exit_when_idle {
        args.extend(["--exit-when-idle", idle]);
    }
    Command::new(env!("CARGO_BIN_EXE_ratchet"))
        .args(args)
        .arg("--config")
        .arg(job)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// What a worker reported when it stopped (it must have stopped cleanly).
pub fn wait_stopped(child: Child) -> Stopped {
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "worker failed:\n{log}");
    stopped_line(&log)
}

/// Runs `processes` workers on `job` until each is idle for 3 s; returns what each reported.
pub fn run_workers(job: &Path, processes: usize) -> Vec<Stopped> {
    let children: Vec<Child> = (0..processes)
        .map(|_| spawn_worker(job, Some("3s")))
        .collect();
    children.into_iter().map(wait_stopped).collect()
}
