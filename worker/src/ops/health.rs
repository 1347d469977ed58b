//! The process's HTTP endpoints on `--metrics-listen`: `GET /metrics` (Prometheus), `GET /health` (liveness: is
//! this process making progress, or crash-looping) and `GET /ready` (readiness: is every subtask this process
//! should run running, with a recent checkpoint cycle). Any other path is 404.
//!
//! | path | 200 when | 503 when (the body says which subtask and why) |
//! |---|---|---|
//! | `/health` | no subtask of this process is crash-looping | a subtask failed [`CRASH_LOOP`] times in a row without a checkpoint in between |
//! | `/ready` | every subtask this process should run (its leases, up to its quota) is running, and each ran its checkpoint cycle (a checkpoint, or an interval with nothing to checkpoint) within 3 x `checkpoint_interval` | before the first lease round, or a subtask is starting, recovering, restarting, stuck or stopping |

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::ops::progress::Progress;

/// Failures in a row, without a checkpoint in between, that make a subtask crash-looping for `/health`.
pub const CRASH_LOOP: u32 = 2;

/// What the process knows about its subtasks, refreshed by its lease rounds.
#[derive(Debug, Default)]
pub struct Health {
    status: Mutex<Option<Status>>,
}

/// One lease round's view.
#[derive(Debug, Clone)]
pub struct Status {
    /// The subtasks this process should run now.
    pub should_run: BTreeSet<u32>,
    /// The subtasks running here (not handing over), and their counters.
    pub running: BTreeMap<u32, Arc<Progress>>,
    /// Failures in a row without a checkpoint, and the last error, per subtask.
    pub failing: BTreeMap<u32, (u32, String)>,
    /// The job's checkpoint interval.
    pub interval: Duration,
    /// When the process started (the origin of [`Progress`]'s times).
    pub started: std::time::Instant,
}

impl Health {
    /// Replaces the view with this round's.
    pub fn publish(&self, status: Status) {
        *self.status.lock().expect("not poisoned") = Some(status);
    }

    /// `/health`: `Ok` with a summary, or `Err` naming the crash-looping subtasks.
    pub fn liveness(&self) -> std::result::Result<String, String> {
        let guard = self.status.lock().expect("not poisoned");
        let Some(status) = guard.as_ref() else {
            return Ok("starting".into());
        };
        let looping: Vec<String> = status
            .failing
            .iter()
            .filter(|(_, (failures, _))| *failures >= CRASH_LOOP)
            .map(|(subtask, (failures, error))| {
                format!("subtask {subtask} failed {failures} times in a row: {error}")
            })
            .collect();
        if looping.is_empty() {
            Ok(format!("ok: {} subtask(s) running", status.running.len()))
        } else {
            Err(looping.join("\n"))
        }
    }

    /// `/ready`: `Ok` when every subtask this process should run is running with a recent checkpoint cycle.
    pub fn readiness(&self) -> std::result::Result<String, String> {
        let guard = self.status.lock().expect("not poisoned");
        let Some(status) = guard.as_ref() else {
            return Err("starting: no lease round yet".into());
        };
        let now = status.started.elapsed().as_millis() as u64;
        let fresh = 3 * status.interval.as_millis() as u64;
        let mut problems = Vec::new();
        for subtask in &status.should_run {
            match status.running.get(subtask) {
                None => problems.push(match status.failing.get(subtask) {
                    Some((failures, error)) => {
                        format!("subtask {subtask} is restarting after {failures} failure(s): {error}")
                    }
                    None => format!("subtask {subtask} is not running here yet"),
                }),
                Some(progress) => match progress.last_cycle_ms.load(Ordering::Relaxed) {
                    u64::MAX => problems.push(format!("subtask {subtask} is recovering")),
                    at if now.saturating_sub(at) > fresh => problems.push(format!(
                        "subtask {subtask} ran no checkpoint cycle for {} ms (more than 3 x checkpoint_interval)",
                        now - at
                    )),
                    _ => {}
                },
            }
        }
        if problems.is_empty() {
            Ok(format!(
                "ready: {} subtask(s) running",
                status.should_run.len()
            ))
        } else {
            Err(problems.join("\n"))
        }
    }
}

/// Serves `/metrics` (from `metrics`), `/health` and `/ready` (from `health`) on `listen`.
///
/// # Errors
/// The address cannot be bound (named).
pub async fn serve(
    listen: SocketAddr,
    metrics: PrometheusHandle,
    health: Arc<Health>,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (--metrics-listen)"))?;
    tracing::info!(%listen, "metrics on http://{listen}/metrics, health on /health and /ready");
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept an HTTP connection");
                    continue;
                }
            };
            let (metrics, health) = (metrics.clone(), health.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let response = respond(request.uri().path(), &metrics, &health);
                    async move { Ok::<_, Infallible>(response) }
                });
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(error = %e, "HTTP connection ended with an error");
                }
            });
        }
    });
    Ok(())
}

fn respond(path: &str, metrics: &PrometheusHandle, health: &Health) -> Response<Full<Bytes>> {
    let (status, body) = match path {
        "/metrics" => (StatusCode::OK, metrics.render()),
        "/health" => match health.liveness() {
            Ok(body) => (StatusCode::OK, body),
            Err(body) => (StatusCode::SERVICE_UNAVAILABLE, body),
        },
        "/ready" => match health.readiness() {
            Ok(body) => (StatusCode::OK, body),
            Err(body) => (StatusCode::SERVICE_UNAVAILABLE, body),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "not found: /metrics, /health, /ready".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body + "\n")));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(last_cycle_ms: u64) -> Arc<Progress> {
        let progress = Progress::starting_at(0);
        progress
            .last_cycle_ms
            .store(last_cycle_ms, Ordering::Relaxed);
        Arc::new(progress)
    }

    fn status(running: &[(u32, Arc<Progress>)], failing: &[(u32, u32)]) -> Status {
        Status {
            should_run: [0, 1].into(),
            running: running.iter().cloned().collect(),
            failing: failing
                .iter()
                .map(|&(s, n)| (s, (n, "broker down".to_string())))
                .collect(),
            interval: Duration::from_secs(3600),
            started: std::time::Instant::now(),
        }
    }

    #[test]
    fn ready_only_when_every_subtask_to_run_runs_with_a_recent_cycle() {
        let health = Health::default();
        assert!(health.readiness().is_err(), "before the first lease round");
        assert!(health.liveness().is_ok());
        health.publish(status(&[(0, progress(0)), (1, progress(0))], &[]));
        assert!(health.readiness().is_ok());
        health.publish(status(&[(0, progress(0)), (1, progress(u64::MAX))], &[]));
        let why = health.readiness().unwrap_err();
        assert!(why.contains("subtask 1 is recovering"), "{why}");
        health.publish(status(&[(0, progress(0))], &[(1, 1)]));
        let why = health.readiness().unwrap_err();
        assert!(why.contains("subtask 1 is restarting"), "{why}");
        assert!(health.liveness().is_ok(), "one failure is not a crash loop");
    }

    #[test]
    fn a_crash_looping_subtask_makes_the_process_unhealthy() {
        let health = Health::default();
        health.publish(status(&[(0, progress(0))], &[(1, CRASH_LOOP)]));
        let why = health.liveness().unwrap_err();
        assert!(
            why.contains("subtask 1 failed 2 times in a row: broker down"),
            "{why}"
        );
    }
}
