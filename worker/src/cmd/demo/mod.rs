//! `ratchet demo`: one job into four kinds of sink at once, a crash in the middle, and the proof.
//!
//! 1. A generator produces `--records` JSON orders (`{"id", "customer", "amount_cents"}`) to a new Kafka topic,
//!    at about 5,000 records/s, while
//! 2. `ratchet run` (a child process, 3 subtasks, 1 s checkpoints, checkpoints in a local directory) writes every
//!    record to local Parquet files, an Iceberg table (SQLite catalog, local warehouse), a PostgreSQL table
//!    (prepared transactions) and a Kafka topic (transactions), all exactly-once;
//! 3. once some checkpoints are visible and half the records are produced, the worker is killed with SIGKILL,
//!    transactions in flight;
//! 4. the worker is started again on the same job file: it recovers every subtask (committing what was decided,
//!    aborting the rest) and runs until it has read nothing for 3 s;
//! 5. every sink is read back with its own client (parquet, iceberg-rust's scan, tokio-postgres, a read_committed
//!    consumer) and compared with the ids produced: per sink, exactly once, or what is missing or duplicated.
//!
//! Everything lives under `--dir` (the job file, the worker logs, the checkpoints, the files, the warehouse), so
//! `ratchet run --config <dir>/job.toml` runs the same job again.

mod generator;
mod job;
mod readback;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use kafka_source::KafkaConnection;

use crate::cli::DemoArgs;
use readback::Verdict;

/// How long the Kafka cluster may take to answer before the demo stops naming it.
const KAFKA_REACHABLE_WITHIN: Duration = Duration::from_secs(10);

/// Runs the demo.
///
/// # Errors
/// A service that cannot be reached (named, with the command that starts it), a worker that fails, or a sink
/// whose output differs from the input.
pub async fn run(args: DemoArgs) -> Result<()> {
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!(".ratchet/demo/{stamp}")));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    KafkaConnection::plaintext(&args.bootstrap)
        .check_reachable(KAFKA_REACHABLE_WITHIN)
        .await
        .map_err(anyhow::Error::from)?;
    readback::check_postgres(&args.pg_url).await?;

    let names = job::Names::new(stamp);
    generator::create_topics(&args.bootstrap, &names).await?;
    let config = job::write(&dir, &args, &names)?;
    println!("job file: {}", config.display());
    println!(
        "input: {} orders to topic {} ({} partitions); sinks: Parquet files, Iceberg table {}, PostgreSQL table {}, \
         Kafka topic {}",
        args.records,
        names.topic,
        job::PARTITIONS,
        names.iceberg_table,
        names.pg_table,
        names.copy_topic
    );

    let produced = Arc::new(AtomicU64::new(0));
    let generating = tokio::spawn(generator::produce(
        args.bootstrap.clone(),
        names.topic.clone(),
        args.records,
        produced.clone(),
    ));
    let mut worker = spawn_worker(&config, &dir.join("worker-1.log"), &[])?;
    let files = dir.join("files");
    let started = Instant::now();
    while !(produced.load(Ordering::Relaxed) >= args.records / 2 && has_visible_parquet(&files)) {
        if let Some(status) = worker.try_wait()? {
            bail!(
                "the worker exited ({status}) before the planned kill; see {}",
                dir.join("worker-1.log").display()
            );
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!(
                "no checkpoint became visible within 2 minutes; see {}",
                dir.join("worker-1.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.kill().context("cannot kill the worker")?;
    worker.wait()?;
    println!(
        "killed the worker with SIGKILL after {} of {} records were produced, with transactions in flight",
        produced.load(Ordering::Relaxed),
        args.records
    );
    generating.await.context("the generator panicked")??;
    println!(
        "restarting the worker on the same job file; it recovers, catches up and stops when idle"
    );
    let mut worker = spawn_worker(
        &config,
        &dir.join("worker-2.log"),
        &["--exit-when-idle", "3s"],
    )?;
    let status = worker.wait()?;
    if !status.success() {
        bail!(
            "the restarted worker failed ({status}); see {}",
            dir.join("worker-2.log").display()
        );
    }

    println!(
        "\nreading every sink back and comparing with the {} ids produced:",
        args.records
    );
    let verdicts = readback::read_all(&dir, &args, &names).await?;
    println!(
        "{:<10} {:<34} {:>8} {:>8} {:>8} {:>10}  verdict",
        "sink", "where", "rows", "distinct", "missing", "duplicates"
    );
    let mut failed = 0;
    for verdict in &verdicts {
        let Verdict {
            sink,
            place,
            rows,
            distinct,
            missing,
            duplicates,
        } = verdict;
        let ok = *missing == 0 && *duplicates == 0;
        failed += usize::from(!ok);
        println!(
            "{sink:<10} {place:<34} {rows:>8} {distinct:>8} {missing:>8} {duplicates:>10}  {}",
            if ok {
                "exactly once"
            } else {
                "DIFFERS from the input"
            }
        );
    }
    if failed > 0 {
        bail!(
            "{failed} sink(s) differ from the input; the worker logs are in {}",
            dir.display()
        );
    }
    println!(
        "\nall {} sinks hold every input record exactly once, across a SIGKILL. Everything is under {}",
        verdicts.len(),
        dir.display()
    );
    Ok(())
}

fn spawn_worker(config: &Path, log: &Path, extra: &[&str]) -> Result<Child> {
    let log_file =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    Command::new(std::env::current_exe()?)
        .arg("run")
        .arg("--config")
        .arg(config)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .context("cannot start the worker")
}

fn has_visible_parquet(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            !name.starts_with('.') && name.ends_with(".parquet")
        })
    })
}
