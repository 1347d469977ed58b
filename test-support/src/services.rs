//! Endpoints of the real services, and checks that they answer.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The root of the repository the tests run in.
///
/// Taken from `CARGO_MANIFEST_DIR` as `cargo test` and `cargo bench` set it when they *run* a test (every package
/// sits one level below the root), not as it was when the binary was compiled: cargo's fingerprints do not
/// depend on the clone's path, so a build directory shared by two clones (`~/.cache/ratchet-target`) may run a
/// test binary compiled in the other clone, whose compile-time path may be gone. The compile-time path is the
/// fallback outside cargo.
pub fn repo_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let at_runtime = std::env::var_os("CARGO_MANIFEST_DIR")
            .map(PathBuf::from)
            .and_then(|package| package.parent().map(Path::to_path_buf))
            .filter(|root| root.join("test-support/verifiers").is_dir());
        at_runtime.unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("test-support/ sits in the repository root")
                .to_path_buf()
        })
    })
}

/// An S3 endpoint with fixed test credentials.
#[derive(Debug, Clone)]
pub struct S3Endpoint {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// Region name to sign with.
    pub region: String,
    /// Access key id.
    pub access_key: String,
    /// Secret key.
    pub secret_key: String,
    /// A bucket tests may write into (use a random prefix per test).
    pub bucket: String,
}

/// The schema registry (Apicurio Registry's Confluent-compatible API) with its basic-auth credentials.
#[derive(Debug, Clone)]
pub struct RegistryEndpoint {
    /// The API's base URL, `http://127.0.0.1:<port>/apis/ccompat/v7`.
    pub url: String,
    /// The same API over HTTPS with the test CA's server certificate (`RATCHET_TLS_CA` trusts it).
    pub tls_url: String,
    /// Basic auth user.
    pub user: String,
    /// Basic auth password.
    pub password: String,
}

/// The `RATCHET_*` endpoints of the test services.
///
/// Read from the environment when `RATCHET_KAFKA_BOOTSTRAP` is set (as `scripts/test.sh` does), otherwise from
/// `scripts/services.sh env`, so `cargo test` works on its own once the services are up. Every accessor checks
/// that its service answers and fails the test with what to run when it does not: a test never skips silently.
#[derive(Debug)]
pub struct Services {
    vars: BTreeMap<String, String>,
    /// Long-lived verifier interpreters (`test-support/verifiers/serve.py`) not in use right now.
    verifiers: Mutex<Vec<Verifier>>,
    /// The same for Spark ([`Services::spark`]): each keeps a Spark session (a JVM of about a gigabyte), so they
    /// are kept apart from the others and only as many start as Spark reads run at once.
    sparks: Mutex<Vec<Verifier>>,
}

/// One `serve.py` process: requests on its stdin, responses on its stdout, a JSON object per line.
#[derive(Debug)]
struct Verifier {
    child: Child,
    requests: ChildStdin,
    responses: BufReader<ChildStdout>,
}

impl Verifier {
    /// Starts a `serve.py`; its stderr (what the scripts' libraries log, not their failures: those come back in
    /// the responses) goes to `stderr`.
    fn spawn(python: &std::path::Path, vars: &BTreeMap<String, String>, stderr: Stdio) -> Self {
        let server = repo_root().join("test-support/verifiers/serve.py");
        let mut child = Command::new(python)
            .arg(&server)
            .envs(vars)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", server.display()));
        let requests = child.stdin.take().expect("piped stdin");
        let responses = BufReader::new(child.stdout.take().expect("piped stdout"));
        Self {
            child,
            requests,
            responses,
        }
    }

    /// Runs `script` with `args`: (succeeded, what it printed, why it failed).
    fn run(&mut self, script: &std::path::Path, args: &[&str]) -> (bool, String, String) {
        let request = serde_json::json!({"path": script, "args": args}).to_string();
        writeln!(self.requests, "{request}")
            .and_then(|()| self.requests.flush())
            .unwrap_or_else(|e| {
                panic!(
                    "the verifier server is gone ({e}): {:?}",
                    self.child.try_wait()
                )
            });
        let mut line = String::new();
        let read = self
            .responses
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("cannot read the verifier server: {e}"));
        assert!(
            read > 0,
            "the verifier server ended: {:?}",
            self.child.try_wait()
        );
        let response: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the verifier server answered {line:?}: {e}"));
        let text = |key: &str| response[key].as_str().unwrap_or_default().to_string();
        (response["ok"] == true, text("stdout"), text("stderr"))
    }
}

impl Services {
    /// The endpoints, loaded once per test binary.
    pub fn get() -> &'static Services {
        static SERVICES: OnceLock<Services> = OnceLock::new();
        SERVICES.get_or_init(Services::load)
    }

    #[allow(clippy::disallowed_methods)] // the endpoints come from the environment `scripts/services.sh env` sets
    fn load() -> Services {
        let mut vars: BTreeMap<String, String> = std::env::vars()
            .filter(|(k, _)| k.starts_with("RATCHET_"))
            .collect();
        if !vars.contains_key("RATCHET_KAFKA_BOOTSTRAP") {
            let script = repo_root().join("scripts/services.sh");
            let out = Command::new(&script)
                .arg("env")
                .output()
                .unwrap_or_else(|e| panic!("cannot run {} env: {e}", script.display()));
            assert!(
                out.status.success(),
                "{} env failed: {}",
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some((k, v)) = line.trim_start_matches("export ").split_once('=') {
                    vars.insert(k.to_string(), v.to_string());
                }
            }
        }
        Services {
            vars,
            verifiers: Mutex::default(),
            sparks: Mutex::default(),
        }
    }

    /// A `RATCHET_*` variable.
    pub fn var(&self, key: &str) -> &str {
        self.vars
            .get(key)
            .unwrap_or_else(|| panic!("{key} is not set; `scripts/services.sh env` prints it"))
    }

    /// The Kafka bootstrap address, after checking the broker listens.
    pub fn kafka_bootstrap(&self) -> &str {
        let address = self.var("RATCHET_KAFKA_BOOTSTRAP");
        require("Kafka", address);
        address
    }

    /// The second Kafka broker, whose idle transactional ids expire after 5 s (`scripts/services.sh` starts it as
    /// `kafka_expiring`), after checking it listens.
    pub fn kafka_expiring_bootstrap(&self) -> &str {
        let address = self.var("RATCHET_KAFKA_EXPIRING_BOOTSTRAP");
        require("Kafka (kafka_expiring)", address);
        address
    }

    /// The SASL_SSL listener of the test broker (`scripts/services.sh` generates its CA and certificates) and the
    /// librdkafka settings that reach it with SASL `mechanism` (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`), the
    /// broker's certificate checked against the test CA, after checking it listens.
    pub fn kafka_sasl_ssl(&self, mechanism: &str) -> (&str, BTreeMap<String, String>) {
        let address = self.var("RATCHET_KAFKA_SASL_SSL_BOOTSTRAP");
        require("Kafka (SASL_SSL listener)", address);
        let settings = [
            ("security.protocol", "SASL_SSL"),
            ("ssl.ca.location", self.var("RATCHET_TLS_CA")),
            ("sasl.mechanism", mechanism),
            ("sasl.username", self.var("RATCHET_KAFKA_SASL_USERNAME")),
            ("sasl.password", self.var("RATCHET_KAFKA_SASL_PASSWORD")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        (address, settings)
    }

    /// The test client certificate and key (PEM) the SASL_SSL listener and PostgreSQL accept.
    pub fn tls_client_identity(&self) -> (&str, &str) {
        (
            self.var("RATCHET_TLS_CLIENT_CERT"),
            self.var("RATCHET_TLS_CLIENT_KEY"),
        )
    }

    /// The PostgreSQL URL (`postgres://ratchet:...@127.0.0.1:<port>/ratchet`), after checking it listens.
    pub fn pg_url(&self) -> &str {
        let url = self.var("RATCHET_PG_URL");
        require("PostgreSQL", host_port(url));
        url
    }

    /// The PostgreSQL server's `host:port` (in [`pg_url`](Self::pg_url)), for a proxy in front of it.
    pub fn pg_host_port(&self) -> &str {
        host_port(self.pg_url())
    }

    /// Toxiproxy's API (`scripts/services.sh up` starts it), after checking it listens.
    pub fn toxiproxy(&self) -> crate::toxiproxy::Toxiproxy {
        let api = self.var("RATCHET_TOXIPROXY_URL");
        require("Toxiproxy", host_port(api));
        crate::toxiproxy::Toxiproxy::new(api)
    }

    /// The test broker behind Toxiproxy: the bootstrap address of its listener that advertises the proxy (so every
    /// connection a client opens stays behind it), and the proxy, healed (no toxics). One proxy for every test:
    /// a test that breaks it must not run beside another that uses it (keep them in one test binary, one test).
    pub async fn kafka_proxied(&self) -> (&str, crate::toxiproxy::Proxy) {
        let bootstrap = self.var("RATCHET_KAFKA_PROXIED_BOOTSTRAP");
        let proxy = self
            .toxiproxy()
            .existing(self.var("RATCHET_KAFKA_PROXY_NAME"))
            .await;
        proxy.heal().await;
        require("Kafka (through Toxiproxy)", bootstrap);
        (bootstrap, proxy)
    }

    /// The MariaDB URL (`mysql://ratchet:...@127.0.0.1:<port>/ratchet`), after checking it listens.
    pub fn mysql_url(&self) -> &str {
        let url = self.var("RATCHET_MYSQL_URL");
        require("MariaDB", host_port(url));
        url
    }

    /// The S3 endpoint (SeaweedFS), after checking it listens.
    pub fn s3(&self) -> S3Endpoint {
        let endpoint = self.var("RATCHET_S3_ENDPOINT").to_string();
        require("SeaweedFS S3", host_port(&endpoint));
        S3Endpoint {
            endpoint,
            region: self.var("RATCHET_S3_REGION").into(),
            access_key: self.var("RATCHET_S3_ACCESS_KEY").into(),
            secret_key: self.var("RATCHET_S3_SECRET_KEY").into(),
            bucket: self.var("RATCHET_S3_BUCKET").into(),
        }
    }

    /// The schema registry, after checking it listens.
    pub fn registry(&self) -> RegistryEndpoint {
        let url = self.var("RATCHET_REGISTRY_URL").to_string();
        require("the schema registry", host_port(&url));
        RegistryEndpoint {
            url,
            tls_url: self.var("RATCHET_REGISTRY_TLS_URL").into(),
            user: self.var("RATCHET_REGISTRY_USER").into(),
            password: self.var("RATCHET_REGISTRY_PASSWORD").into(),
        }
    }

    /// Kafka Connect's REST API (the `connect` service, with Debezium's PostgreSQL connector), after checking it
    /// listens.
    pub fn connect_url(&self) -> &str {
        let url = self.var("RATCHET_CONNECT_URL");
        require("Kafka Connect", host_port(url));
        url
    }

    /// Runs the change-data-capture peer `test-support/cdc/debezium.py` (Debezium connectors registered over Kafka
    /// Connect's REST API, and a workload on the captured PostgreSQL table) with `args`, and returns what it
    /// printed (JSON). Fails with its stderr when it fails.
    pub fn cdc(&self, args: &[&str]) -> serde_json::Value {
        self.python_script(&repo_root().join("test-support/cdc/debezium.py"), args)
    }

    /// The Python interpreter of the verifiers' venv.
    pub fn python(&self) -> PathBuf {
        let python = PathBuf::from(self.var("RATCHET_PYTHON"));
        assert!(
            python.exists(),
            "{} missing: run `scripts/services.sh up` to install the verifiers",
            python.display()
        );
        python
    }

    /// What a read_committed consumer (the independent verifier `kafka_read_committed.py`) sees in `topic` on the
    /// broker at `bootstrap`: the `id` field of every record's JSON value, sorted, one entry per visible copy
    /// (tombstones, records with a null value, have no id and are left out), and the verifier's per-partition
    /// offsets (`lso`, `high_watermark`).
    pub fn kafka_ids(&self, bootstrap: &str, topic: &str) -> (Vec<i64>, serde_json::Value) {
        let seen = self.verify("kafka_read_committed.py", &[bootstrap, topic]);
        let mut ids: Vec<i64> = seen["records"]
            .as_array()
            .expect("the verifier lists records")
            .iter()
            .filter(|r| !r["value"].is_null())
            .map(|r| {
                let value = r["value"].as_str().expect("a record value");
                serde_json::from_str::<serde_json::Value>(value).expect("a JSON record")["id"]
                    .as_i64()
                    .expect("an id field")
            })
            .collect();
        ids.sort_unstable();
        (ids, seen["partitions"].clone())
    }

    /// Runs the independent verifier `test-support/verifiers/<script>` with `args` and returns what it printed
    /// (JSON). Fails the test with the verifier's stderr when it fails.
    ///
    /// The scripts run in long-lived interpreters (`test-support/verifiers/serve.py`, one per concurrent caller),
    /// exactly as a one-shot run would execute them, without paying Python's start-up and imports every time.
    pub fn verify(&self, script: &str, args: &[&str]) -> serde_json::Value {
        self.pooled(&self.verifiers, Stdio::inherit, "verifiers", script, args)
    }

    /// Runs `test-support/verifiers/spark_iceberg.py` with `args` (Apache Spark with Iceberg's runtime: a read, a
    /// foreign write or compaction) as [`verify`](Self::verify) runs a verifier, in interpreters kept for Spark:
    /// each keeps its Spark session between runs, so the JVM starts once per concurrent caller, not per call. Spark's
    /// own log is discarded (its start-up warnings would fill the test output); a failure's Python and Java
    /// traceback comes back in the panic.
    pub fn spark(&self, args: &[&str]) -> serde_json::Value {
        self.pooled(
            &self.sparks,
            Stdio::null,
            "verifiers",
            "spark_iceberg.py",
            args,
        )
    }

    /// Runs the producer peer `test-support/producers/<script>` with `args` (as [`verify`](Self::verify) runs a
    /// verifier) and returns what it printed (JSON): records written by the real client libraries of the
    /// ecosystem (confluent-kafka's schema registry serializers), not by Ratchet code.
    pub fn produce(&self, script: &str, args: &[&str]) -> serde_json::Value {
        self.pooled(&self.verifiers, Stdio::inherit, "producers", script, args)
    }

    /// Runs `test-support/<dir>/<script>` in an idle interpreter of `pool` (a new one, its stderr `stderr()`, when
    /// none is idle).
    fn pooled(
        &self,
        pool: &Mutex<Vec<Verifier>>,
        stderr: fn() -> Stdio,
        dir: &str,
        script: &str,
        args: &[&str],
    ) -> serde_json::Value {
        let path = repo_root().join("test-support").join(dir).join(script);
        let idle = pool.lock().expect("verifier pool").pop();
        let mut verifier =
            idle.unwrap_or_else(|| Verifier::spawn(&self.python(), &self.vars, stderr()));
        let (ok, stdout, stderr) = verifier.run(&path, args);
        pool.lock().expect("verifier pool").push(verifier);
        assert!(ok, "{script} {args:?} failed:\n{stderr}");
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{script} printed no JSON ({e}):\n{stdout}"))
    }

    /// Starts the verifier `test-support/verifiers/<script>` with `args` as a process of its own that runs beside
    /// the test (a foreign writer or maintainer): its stdout piped (what it prints at the end), its stderr into
    /// the file `log` (a pipe nobody reads while it runs would fill and stop it); the caller waits for it.
    pub fn spawn_verifier(&self, script: &str, args: &[&str], log: &Path) -> std::process::Child {
        let path = repo_root().join("test-support/verifiers").join(script);
        let log = std::fs::File::create(log)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        Command::new(self.python())
            .arg(&path)
            .args(args)
            .envs(&self.vars)
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", path.display()))
    }

    /// Runs the Python script at `path` in the verifiers' venv (with the services' environment) and returns what
    /// it printed (JSON); benchmarks run their Python peers this way. Fails with the script's stderr when it fails.
    pub fn python_script(&self, path: &std::path::Path, args: &[&str]) -> serde_json::Value {
        let script = path.display();
        let out = Command::new(self.python())
            .arg(path)
            .args(args)
            .envs(&self.vars)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
        assert!(
            out.status.success(),
            "verifier {script} {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "verifier {script} printed no JSON ({e}):\n{}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}

impl Services {
    /// Runs `sql` with `psql` (the PostgreSQL client, an independent reader) against the test database and returns
    /// its unaligned, tuples-only output.
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args([
                self.pg_url(),
                "-X",
                "-q",
                "-t",
                "-A",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot run psql (install postgresql-client): {e}"));
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// `host:port` of a URL such as `postgres://u:p@127.0.0.1:15432/db` or `http://127.0.0.1:18333`.
fn host_port(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest)
}

fn require(name: &str, address: &str) {
    let reachable = address
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .is_some_and(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok());
    assert!(
        reachable,
        "{name} is not reachable at {address}: start the test services with `scripts/services.sh up` \
         (scripts/test.sh does this for you)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_of_urls() {
        assert_eq!(
            host_port("postgres://u:p@127.0.0.1:15432/db"),
            "127.0.0.1:15432"
        );
        assert_eq!(host_port("http://127.0.0.1:18333"), "127.0.0.1:18333");
        assert_eq!(host_port("127.0.0.1:19092"), "127.0.0.1:19092");
    }

    #[test]
    #[should_panic(expected = "scripts/services.sh up")]
    fn an_unreachable_service_fails_with_what_to_run() {
        require("Nothing", "127.0.0.1:1");
    }
}
