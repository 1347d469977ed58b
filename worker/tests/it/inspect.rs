//! `ratchet inspect` and `ratchet resolve` on a real in-doubt state: a worker kills itself with SIGKILL right after
//! a checkpoint record became durable and before any sink committed it (the `RATCHET_KILL_AT` crash drill).
//! `inspect` then shows, in each of the four sink kinds, the transaction recovery will commit (a Kafka transaction,
//! a PostgreSQL prepared transaction, pending Parquet files, Iceberg data files no snapshot references);
//! `resolve` commits them without starting the job, after which `inspect` shows nothing pending and the
//! independent readers see the same records, once each, in every sink.

use crate::common;

use std::time::{Duration, Instant};

use common::Job;

/// The lines of `inspect`'s output about sink `id`.
fn sink_section<'a>(out: &'a str, id: &str) -> Vec<&'a str> {
    let mut section = Vec::new();
    let mut inside = false;
    for line in out.lines() {
        if line.starts_with("  sink ") {
            inside = line.starts_with(&format!("  sink {id}:"));
        } else if !line.starts_with("    ") {
            inside = false;
        }
        if inside {
            section.push(line);
        }
    }
    section
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_shows_in_doubt_transactions_in_every_sink_and_resolve_settles_them() {
    let mut job = Job::new("inspect", 2, 1, "3s").await;
    job.produce(500).await;
    job.run_until_drill("after-record-durable:3").await;

    let out = job.ratchet("inspect");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{stdout}");
    assert!(stdout.contains("last checkpoint 3 is decided"), "{stdout}");
    for sink in ["archive", "copy", "db", "lake"] {
        let section = sink_section(&stdout, sink);
        assert!(
            section
                .iter()
                .any(|l| l.contains("checkpoint 3") && l.contains("-> commit")),
            "sink {sink} shows no in-doubt transaction of checkpoint 3:\n{stdout}"
        );
    }

    // The killed worker's lease is live for up to 3 s: resolve waits for it to expire (and would refuse, naming
    // the reason, if the worker kept renewing it).
    let deadline = Instant::now() + Duration::from_secs(30);
    let resolved = loop {
        let out = job.ratchet("resolve");
        if out.status.success() {
            break String::from_utf8_lossy(&out.stdout).into_owned();
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("is running"), "{stderr}");
        assert!(Instant::now() < deadline, "resolve kept refusing: {stderr}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(resolved.contains("checkpoint 3 committed"), "{resolved}");

    let out = job.ratchet("inspect");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("will commit 0 and abort 0"), "{stdout}");

    // Every sink holds the same records, once each: checkpoint 3's among them.
    let views = job.read_back();
    let (_, first) = &views[0];
    assert!(!first.is_empty());
    for (sink, ids) in &views {
        let mut distinct = ids.clone();
        distinct.dedup();
        assert_eq!(&distinct, ids, "{sink} holds duplicates");
        assert_eq!(ids, first, "{sink} differs from {}", views[0].0);
    }
}
