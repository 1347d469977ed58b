//! The deployment examples run as written (deploy/): the binary is started with exactly the command line and
//! environment each sets, only the paths and server addresses swapped for the test's.
//!
//! - systemd (`deploy/systemd/ratchet@.service`): three instances of the unit template (`%i` = 0, 1, 2) share a job
//!   as static members; every record once.
//! - Kubernetes (`deploy/kubernetes/ratchet.yaml`, read with PyYAML): the StatefulSet's three pods, each with the
//!   container's arguments (`$(POD_NAME)` expanded as Kubernetes does) and environment, run the ConfigMap's job
//!   file (servers overridden with `RATCHET__...` variables, as a per-cluster overlay would); their readiness and
//!   liveness probes answer 200 on the paths the manifest names; every record once in the table.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Job, Worker, free_port, http_get};
use serde_json::Value;
use test_support::Services;

fn deploy(path: &str) -> PathBuf {
    test_support::repo_root().join("deploy").join(path)
}

/// Starts the built binary with `args` and exactly `env` added; its log goes next to the job file.
fn spawn(job: &Job, name: &str, args: &[String], env: &[(String, String)]) -> Worker {
    let log = job.dir.path().join(format!("{name}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_ratchet"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Worker {
        child: Some(child),
        log,
    }
}

/// The unit template's `ExecStart` command line and `Environment=` settings for instance `instance`.
fn systemd_unit(instance: &str) -> (Vec<String>, Vec<(String, String)>) {
    let text = std::fs::read_to_string(deploy("systemd/ratchet@.service")).unwrap();
    let mut command = None;
    let mut env = Vec::new();
    for line in text.lines().map(|l| l.replace("%i", instance)) {
        if let Some(exec) = line.strip_prefix("ExecStart=") {
            command = Some(
                exec.split_whitespace()
                    .map(str::to_string)
                    .collect::<Vec<_>>(),
            );
        } else if let Some(setting) = line.strip_prefix("Environment=") {
            let (key, value) = setting.split_once('=').expect("KEY=VALUE");
            env.push((key.to_string(), value.to_string()));
        }
    }
    let command = command.expect("an ExecStart line");
    assert_eq!(command[0], "/usr/local/bin/ratchet", "{command:?}");
    assert!(
        text.contains("KillSignal=SIGTERM"),
        "the unit stops the worker gracefully"
    );
    (command[1..].to_vec(), env)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_systemd_unit_template_runs_static_members() {
    let mut job = Job::new("systemd", 3, 3, "3s").await;
    let config = job.config.display().to_string();
    let mut members: Vec<Worker> = ["0", "1", "2"]
        .iter()
        .map(|instance| {
            let (args, env) = systemd_unit(instance);
            let args: Vec<String> = args
                .into_iter()
                .map(|a| a.replace("/etc/ratchet/job.toml", &config))
                .collect();
            spawn(&job, &format!("ratchet@{instance}"), &args, &env)
        })
        .collect();
    job.produce(3000).await;
    job.wait_delivered(Duration::from_secs(120));
    for (i, member) in members.iter_mut().enumerate() {
        let log = member.log_text();
        assert!(
            // The unit logs JSON (for journald): the share is a field of the startup line.
            log.contains("static membership") && log.contains(&format!("\"subtasks\":\"{{{i}}}\"")),
            "instance {i}:\n{log}"
        );
        member.stop(Duration::from_secs(60));
    }
    job.assert_exactly_once();
}

/// The ids in the job's table (psycopg) and the prepared transactions of its sink `db` (default scope
/// `<job>~db`) still on the server.
fn table_ids(job: &Job) -> (Vec<i64>, Vec<Value>) {
    let services = Services::get();
    let scope = format!("{}~db", job.name);
    let read = services.verify(
        "sql_table.py",
        &["pg", services.pg_url(), &job.table, "id", &scope],
    );
    let ids = read["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    (ids, read["prepared"].as_array().unwrap().clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kubernetes_statefulset_runs_its_pods_as_static_members() {
    let services = Services::get();
    let manifest = services.verify(
        "k8s_manifest.py",
        &[deploy("kubernetes/ratchet.yaml").to_str().unwrap()],
    );
    let replicas = manifest["replicas"].as_u64().unwrap();
    let (mount, config_map) = manifest["mounts"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .map(|(m, c)| (m.clone(), c.as_str().unwrap().to_string()))
        .unwrap();
    let job_toml = manifest["config_maps"][&config_map]["job.toml"]
        .as_str()
        .unwrap();
    let subtasks: u32 = job_toml
        .lines()
        .find_map(|l| l.strip_prefix("subtasks = "))
        .unwrap()
        .parse()
        .unwrap();
    let mut job = Job::new("k8s", subtasks as i32, subtasks, "3s").await;
    // The ConfigMap mounted where the manifest mounts it, under the test's directory.
    let mounted = job.dir.path().join(mount.trim_start_matches('/'));
    std::fs::create_dir_all(&mounted).unwrap();
    std::fs::write(mounted.join("job.toml"), job_toml).unwrap();
    // A per-cluster overlay: the test's servers and names.
    let overrides = [
        ("RATCHET__JOB__NAME", job.name.clone()),
        (
            "RATCHET__SOURCE__BOOTSTRAP_SERVERS",
            services.kafka_bootstrap().to_string(),
        ),
        ("RATCHET__SOURCE__TOPIC", job.topic.clone()),
        ("RATCHET__STORE__URL", services.pg_url().to_string()),
        ("RATCHET__SINKS__0__URL", services.pg_url().to_string()),
        ("RATCHET__SINKS__0__TABLE", job.table.clone()),
    ];
    // The Secret's value: the test database's password (from the URL's user info).
    let secret = services
        .pg_url()
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(user, _)| user.split_once(':'))
        .map(|(_, password)| password.to_string())
        .unwrap_or_default();
    let mut pods = Vec::new();
    for ordinal in 0..replicas {
        let pod = format!("ratchet-{ordinal}");
        let port = free_port();
        let args: Vec<String> = manifest["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let a = a.as_str().unwrap().replace("$(POD_NAME)", &pod);
                let a = a.replace(&mount, &mounted.display().to_string());
                // One host, several pods: each its own metrics port.
                if a.ends_with(":9898") {
                    format!("127.0.0.1:{port}")
                } else {
                    a
                }
            })
            .collect();
        let mut env: Vec<(String, String)> = manifest["env"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    Value::String(s) => s.clone(),
                    v if v.get("fieldRef").is_some() => {
                        assert_eq!(v["fieldRef"], "metadata.name", "{k}");
                        pod.clone()
                    }
                    v if v.get("secretKeyRef").is_some() => secret.clone(),
                    other => panic!("{k}: {other}"),
                };
                (k.clone(), value)
            })
            .collect();
        env.extend(overrides.iter().map(|(k, v)| (k.to_string(), v.clone())));
        pods.push((spawn(&job, &pod, &args, &env), port));
    }
    job.produce(3000).await;
    let probe = |key: &str| manifest[key]["path"].as_str().unwrap().to_string();
    let (ready, live) = (probe("readiness"), probe("liveness"));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (ids, _) = table_ids(&job);
        let all_ready = pods
            .iter()
            .all(|(_, port)| http_get(*port, &ready).is_some_and(|(status, _)| status == 200));
        if ids.len() >= 3000 && all_ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} rows, pods ready: {all_ready}:\n{}",
            ids.len(),
            pods[0].0.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (pod, port) in &mut pods {
        assert_eq!(
            http_get(*port, &live).map(|(s, _)| s),
            Some(200),
            "{}",
            pod.log_text()
        );
        pod.stop(Duration::from_secs(60));
    }
    let (mut ids, prepared) = table_ids(&job);
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..3000).collect::<Vec<_>>(),
        "every record once in the table"
    );
    assert!(prepared.is_empty(), "{prepared:?}");
}
