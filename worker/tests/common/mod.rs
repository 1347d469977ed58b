//! A job for `ratchet run` tests: a source topic of JSON records `{"id": n}`, and four sinks of different kinds
//! (local Parquet files, a Kafka topic, a PostgreSQL table through prepared transactions, an Iceberg table in a
//! SQL catalog on PostgreSQL), with the checkpoint store in PostgreSQL; worker processes started from the built
//! binary; every sink read back by its independent verifier (pyarrow, a read_committed confluent-kafka consumer,
//! psycopg, pyiceberg and DuckDB).
//!
//! Shared by the test binaries `it`, `chaos` and `grey`, none of which uses every helper.
#![allow(dead_code, unused_imports)]

mod http;
mod process;
mod random;
mod registry;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use test_support::Services;

pub use http::{free_port, http_get, scrape, total};
pub use process::Worker;
pub use random::{Rng, env_u64, seed};
pub use registry::order_schema;

/// One job: its files, names and the records produced so far.
pub struct Job {
    pub dir: tempfile::TempDir,
    pub name: String,
    pub topic: String,
    pub copy_topic: String,
    pub table: String,
    pub config: PathBuf,
    pub produced: u64,
    producer: FutureProducer,
    workers: usize,
    /// Where the file sink writes when it was moved to S3 ([`archive_on_s3`](Self::archive_on_s3)): the prefix.
    archive_s3: Option<String>,
}

impl Job {
    /// Creates the source topic (`partitions`) and writes a job file of `subtasks` subtasks, `lease`, 500 ms
    /// checkpoints.
    pub async fn new(prefix: &str, partitions: i32, subtasks: u32, lease: &str) -> Self {
        Self::with_sections(prefix, partitions, subtasks, lease, |_| String::new()).await
    }

    /// [`new`](Self::new) with the source's `decoding` (a TOML inline table) instead of JSON `{"id": n}`.
    pub async fn with_decoding(
        prefix: &str,
        partitions: i32,
        subtasks: u32,
        lease: &str,
        decoding: &str,
    ) -> Self {
        let job = Self::new(prefix, partitions, subtasks, lease).await;
        job.set_decoding(decoding);
        job
    }

    /// Replaces the source's `decoding` (a TOML inline table) in the job file.
    pub fn set_decoding(&self, decoding: &str) {
        let text = std::fs::read_to_string(&self.config).unwrap();
        let current = text
            .lines()
            .find(|l| l.starts_with("decoding = "))
            .unwrap()
            .to_string();
        std::fs::write(
            &self.config,
            text.replace(&current, &format!("decoding = {decoding}")),
        )
        .unwrap();
    }

    /// The JSON values a read_committed consumer (the independent verifier) sees in the Kafka copy.
    pub fn copy_values(&self) -> Vec<serde_json::Value> {
        let services = Services::get();
        services.verify(
            "kafka_read_committed.py",
            &[services.kafka_bootstrap(), &self.copy_topic],
        )["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| serde_json::from_str(r["value"].as_str().unwrap()).unwrap())
            .collect()
    }

    /// [`new`](Self::new), with more of the job file after the sinks: `extra` gets the job's name.
    pub async fn with_sections(
        prefix: &str,
        partitions: i32,
        subtasks: u32,
        lease: &str,
        extra: impl Fn(&str) -> String,
    ) -> Self {
        let services = Services::get();
        let name = test_support::unique_name(prefix).replace('-', "_");
        let topic = format!("{name}-in");
        let copy_topic = format!("{name}-copy");
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", services.kafka_bootstrap())
            .create()
            .unwrap();
        for result in admin
            .create_topics(
                &[
                    NewTopic::new(&topic, partitions, TopicReplication::Fixed(1)),
                    NewTopic::new(&copy_topic, 3, TopicReplication::Fixed(1)),
                ],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
            )
            .await
            .unwrap()
        {
            result.unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("job.toml");
        let text = format!(
            r#"
[job]
name = "{name}"
subtasks = {subtasks}
checkpoint_interval = "500ms"
lease = "{lease}"

[source]
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
decoding = {{ kind = "json", fields = [ {{ name = "id", type = "int64", nullable = false }} ] }}

[store]
kind = "postgres"
url = "{pg}"

[[sinks]]
type = "file"
id = "archive"
storage = {{ kind = "local", path = "{out}" }}

[[sinks]]
type = "kafka"
id = "copy"
bootstrap_servers = "{bootstrap}"
topic = "{copy_topic}"
transactional_id_prefix = "{copy_topic}"

[[sinks]]
type = "jdbc"
id = "db"
url = "{pg}"
table = "{name}"
scope = "{name}"
create_table = true

[[sinks]]
type = "iceberg"
id = "lake"
catalog = {{ kind = "sql", uri = "{pg}", warehouse = "file://{warehouse}" }}
table = "{name}.orders"
create_table = true
"#,
            bootstrap = services.kafka_bootstrap(),
            pg = services.pg_url(),
            out = dir.path().join("out").display(),
            warehouse = dir.path().join("warehouse").display(),
        ) + &extra(&name);
        std::fs::write(&config, text).unwrap();
        let producer = ClientConfig::new()
            .set("bootstrap.servers", services.kafka_bootstrap())
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .create()
            .unwrap();
        Self {
            dir,
            table: name.clone(),
            name,
            topic,
            copy_topic,
            config,
            produced: 0,
            producer,
            workers: 0,
            archive_s3: None,
        }
    }

    /// Replaces the first `from` in the job file with `to` (which must be there).
    pub fn edit_config(&self, from: &str, to: &str) {
        let text = std::fs::read_to_string(&self.config).unwrap();
        assert!(text.contains(from), "the job file has no {from:?}:\n{text}");
        std::fs::write(&self.config, text.replacen(from, to, 1)).unwrap();
    }

    /// Points the checkpoint store (and the leases) at `address` (`host:port`, e.g. a proxy) instead of the
    /// PostgreSQL server; the sinks keep the server.
    pub fn store_through(&self, address: &str) {
        let services = Services::get();
        let url = services.pg_url();
        self.edit_config(
            &format!("[store]\nkind = \"postgres\"\nurl = \"{url}\""),
            &format!(
                "[store]\nkind = \"postgres\"\nurl = \"{}\"",
                url.replace(services.pg_host_port(), address)
            ),
        );
    }

    /// Moves the checkpoint store to the local store (the default a new user starts with), in the job's `state`
    /// directory.
    pub fn store_locally(&self) {
        let url = Services::get().pg_url();
        self.edit_config(
            &format!("[store]\nkind = \"postgres\"\nurl = \"{url}\""),
            &format!(
                "[store]\nkind = \"local\"\npath = \"{}\"",
                self.state_dir().display()
            ),
        );
    }

    /// Where [`store_locally`](Self::store_locally) keeps the checkpoint store.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Moves the file sink ("archive") to the test bucket on S3, reached at `address` (`host:port`: the S3 server,
    /// or a proxy in front of it), under a prefix of the job's name; [`read_back`](Self::read_back) reads it there.
    pub fn archive_on_s3(&mut self, address: &str) {
        let s3 = Services::get().s3();
        let prefix = format!("{}-archive", self.name);
        self.edit_config(
            &format!(
                "storage = {{ kind = \"local\", path = \"{}\" }}",
                self.dir.path().join("out").display()
            ),
            &format!(
                "storage = {{ kind = \"s3\", bucket = \"{}\", prefix = \"{prefix}\", region = \"{}\", \
                 endpoint = \"http://{address}\", access_key_id = \"{}\", secret_access_key = \"{}\", \
                 force_path_style = true }}",
                s3.bucket, s3.region, s3.access_key, s3.secret_key
            ),
        );
        self.archive_s3 = Some(prefix);
    }

    /// Produces the next `count` ids as JSON `{"id": n}` (acknowledged before returning).
    pub async fn produce(&mut self, count: u64) {
        self.produce_encoded(count, |id| format!(r#"{{"id":{id}}}"#).into_bytes())
            .await;
    }

    /// Produces the next `count` ids with `encode` making each value (acknowledged before returning).
    pub async fn produce_encoded(&mut self, count: u64, encode: impl Fn(i64) -> Vec<u8>) {
        let topic = self.topic.clone();
        self.produce_encoded_into(&topic, count, encode).await;
    }

    /// Produces the next `count` ids as JSON `{"id": n}` into `topic` (another topic the job reads).
    pub async fn produce_into(&mut self, topic: &str, count: u64) {
        self.produce_encoded_into(topic, count, |id| format!(r#"{{"id":{id}}}"#).into_bytes())
            .await;
    }

    /// Produces the next `count` ids as JSON `{"id": n}` into the source topic in transactions of `per_transaction`
    /// records (each ends in a commit marker, which read_committed readers skip).
    pub fn produce_transactionally(&mut self, count: u64, per_transaction: u64) {
        use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", Services::get().kafka_bootstrap())
            .set("transactional.id", format!("{}-test-input", self.name))
            .create()
            .unwrap();
        let within = Duration::from_secs(30);
        producer.init_transactions(within).unwrap();
        let ids: Vec<i64> = (self.produced as i64..(self.produced + count) as i64).collect();
        for chunk in ids.chunks(per_transaction as usize) {
            producer.begin_transaction().unwrap();
            for id in chunk {
                let value = format!(r#"{{"id":{id}}}"#);
                let key = id.to_string();
                producer
                    .send(BaseRecord::to(&self.topic).key(&key).payload(&value))
                    .map_err(|(e, _)| e)
                    .unwrap();
            }
            producer.commit_transaction(within).unwrap();
        }
        self.produced += count;
    }

    async fn produce_encoded_into(
        &mut self,
        topic: &str,
        count: u64,
        encode: impl Fn(i64) -> Vec<u8>,
    ) {
        let mut deliveries = Vec::with_capacity(count as usize);
        for id in self.produced..self.produced + count {
            let value = encode(id as i64);
            let key = id.to_string();
            let delivery = self
                .producer
                .send_result(FutureRecord::to(topic).key(&key).payload(&value))
                .map_err(|(e, _)| e)
                .unwrap();
            deliveries.push(delivery);
        }
        for delivery in deliveries {
            delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
        }
        self.produced += count;
    }

    /// Produces the next `count` ids as JSON `{"id": n}` to `partition` (acknowledged before returning).
    pub async fn produce_to(&mut self, partition: i32, count: u64) {
        let mut deliveries = Vec::with_capacity(count as usize);
        for id in self.produced..self.produced + count {
            let value = format!(r#"{{"id":{id}}}"#);
            let delivery = self
                .producer
                .send_result(
                    FutureRecord::<str, str>::to(&self.topic)
                        .partition(partition)
                        .payload(&value),
                )
                .map_err(|(e, _)| e)
                .unwrap();
            deliveries.push(delivery);
        }
        for delivery in deliveries {
            delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
        }
        self.produced += count;
    }

    /// DeleteRecords on the source topic: removes `partition`'s records below offset `before` (what retention
    /// does to the oldest segments).
    pub async fn delete_records_before(&self, partition: i32, before: i64) {
        let mut list = rdkafka::TopicPartitionList::new();
        list.add_partition_offset(&self.topic, partition, rdkafka::Offset::Offset(before))
            .unwrap();
        let deleted = admin()
            .delete_records(
                &list,
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
            )
            .await
            .unwrap();
        for element in deleted.elements() {
            element.error().unwrap();
        }
    }

    /// Runs a worker with the crash drill `RATCHET_KILL_AT=<step>:<checkpoint>`, producing 300 more records every
    /// 200 ms until it fires, and asserts the worker died by SIGKILL.
    pub async fn run_until_drill(&mut self, at: &str) {
        use std::os::unix::process::ExitStatusExt;
        let mut worker = self.spawn_worker_with_env(&[], &[("RATCHET_KILL_AT", at)]);
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(status) = worker.exited() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the drill never fired:\n{}",
                worker.log_text()
            );
            self.produce(300).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(status.signal(), Some(9), "{}", worker.log_text());
        worker.child = None;
    }

    /// Grows the source topic to `partitions` partitions.
    pub async fn add_partitions(&self, partitions: usize) {
        for result in admin()
            .create_partitions(
                &[NewPartitions::new(&self.topic, partitions)],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
            )
            .await
            .unwrap()
        {
            result.unwrap();
        }
        // Until the producer's metadata knows them, it refuses to send to the new partitions.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            use rdkafka::producer::Producer;
            let known = self
                .producer
                .client()
                .fetch_metadata(Some(&self.topic), Duration::from_secs(10))
                .unwrap()
                .topics()
                .iter()
                .map(|t| t.partitions().len())
                .sum::<usize>();
            if known >= partitions {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} still shows {known} partitions",
                self.topic
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Produces a tombstone (a record with a null value) for each key, acknowledged before returning.
    pub async fn produce_tombstones(&mut self, keys: &[&str]) {
        for key in keys {
            let delivery = self
                .producer
                .send_result(FutureRecord::<str, str>::to(&self.topic).key(key))
                .map_err(|(e, _)| e)
                .unwrap();
            delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
        }
    }

    /// Produces `values` as they are (records that are not `{"id": n}`), each with the header `origin: raw`,
    /// acknowledged before returning.
    pub async fn produce_raw(&mut self, values: &[&str]) {
        for value in values {
            let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
                key: "origin",
                value: Some("raw"),
            });
            let delivery = self
                .producer
                .send_result(
                    FutureRecord::<str, str>::to(&self.topic)
                        .payload(value)
                        .headers(headers),
                )
                .map_err(|(e, _)| e)
                .unwrap();
            delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
        }
    }

    /// Starts a `ratchet run` process on the job file; its output goes to `worker-<n>.log` in the job's directory.
    pub fn spawn_worker(&mut self, extra: &[&str]) -> Worker {
        self.spawn_worker_with_env(extra, &[])
    }

    /// [`spawn_worker`](Self::spawn_worker) with extra environment variables.
    pub fn spawn_worker_with_env(&mut self, extra: &[&str], env: &[(&str, &str)]) -> Worker {
        self.workers += 1;
        let log_path = self.dir.path().join(format!("worker-{}.log", self.workers));
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ratchet"))
            .arg("run")
            .arg("--config")
            .arg(&self.config)
            .args(extra)
            .env("RUST_LOG", "info")
            .env("RUST_BACKTRACE", "0")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Worker {
            child: Some(child),
            log: log_path,
        }
    }

    /// Runs `ratchet <command> --config <the job file>` to completion.
    pub fn ratchet(&self, command: &str) -> std::process::Output {
        self.ratchet_with(&[command])
    }

    /// `ratchet <args...> --config <job file>`, waited for.
    pub fn ratchet_with(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_ratchet"))
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap()
    }

    /// What every sink's independent reader sees, ids sorted, by sink; asserts nothing is left behind (hidden
    /// files, open or prepared transactions, unreferenced Iceberg files) and that DuckDB reads the Iceberg table
    /// as pyiceberg does.
    pub fn read_back(&self) -> Vec<(&'static str, Vec<i64>)> {
        let services = Services::get();
        let files = match &self.archive_s3 {
            Some(prefix) => services.verify(
                "visible_ids.py",
                &["s3", &services.s3().bucket, prefix, "id"],
            ),
            None => services.verify(
                "visible_ids.py",
                &[
                    "local",
                    &self.dir.path().join("out").display().to_string(),
                    "id",
                ],
            ),
        };
        let strays = files["strays"].as_array().unwrap();
        assert!(strays.is_empty(), "the file sink left {strays:?}");
        let (kafka, partitions) = services.kafka_ids(services.kafka_bootstrap(), &self.copy_topic);
        for (p, offsets) in partitions.as_object().unwrap() {
            assert_eq!(
                offsets["lso"], offsets["high_watermark"],
                "partition {p} of {} has an open transaction",
                self.copy_topic
            );
        }
        let table = services.verify(
            "sql_table.py",
            &["pg", services.pg_url(), &self.table, "id", &self.name],
        );
        let prepared = table["prepared"].as_array().unwrap();
        assert!(
            prepared.is_empty(),
            "prepared transactions left: {prepared:?}"
        );
        let ids = sorted_ids;
        let lake = self.read_lake(&[]);
        assert_eq!(
            lake["unreferenced"],
            serde_json::json!([]),
            "Iceberg files left behind"
        );
        assert_eq!(
            ids(&lake["ids"]),
            ids(&lake["duckdb_ids"]),
            "pyiceberg and DuckDB disagree"
        );
        vec![
            ("files", ids(&files["ids"])),
            ("kafka", kafka),
            ("table", ids(&table["ids"])),
            ("iceberg", ids(&lake["ids"])),
        ]
    }

    /// What pyiceberg and DuckDB see in the job's Iceberg table (`iceberg_table.py`, `flags` such as
    /// `--columns` after its arguments).
    pub fn read_lake(&self, flags: &[&str]) -> serde_json::Value {
        let services = Services::get();
        let uri = services
            .pg_url()
            .replacen("postgres://", "postgresql+psycopg://", 1);
        let warehouse = format!("file://{}", self.dir.path().join("warehouse").display());
        let table = format!("{}.orders", self.name);
        let mut args = vec![
            "ratchet",
            uri.as_str(),
            warehouse.as_str(),
            table.as_str(),
            "id",
        ];
        args.extend_from_slice(flags);
        services.verify("iceberg_table.py", &args)
    }

    /// Waits (polling the read_committed verifier) until the Kafka copy holds every produced record, at most
    /// `within`.
    pub fn wait_delivered(&self, within: Duration) {
        self.wait_copied(self.produced as usize, within);
    }

    /// Waits (polling the read_committed verifier) until the Kafka copy holds `records` records, at most `within`.
    pub fn wait_copied(&self, records: usize, within: Duration) {
        let services = Services::get();
        let deadline = Instant::now() + within;
        loop {
            let (ids, _) = services.kafka_ids(services.kafka_bootstrap(), &self.copy_topic);
            if ids.len() >= records {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {records} records reached {} within {within:?}",
                ids.len(),
                self.copy_topic
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Asserts every sink holds every produced id exactly once.
    pub fn assert_exactly_once(&self) {
        let expected: Vec<i64> = (0..self.produced as i64).collect();
        self.assert_holds(&expected);
    }

    /// Asserts every sink holds exactly the ids `expected` (sorted), each once.
    pub fn assert_holds(&self, expected: &[i64]) {
        for (sink, ids) in self.read_back() {
            assert_eq!(
                ids.len(),
                expected.len(),
                "{sink}: {} rows for {} records",
                ids.len(),
                expected.len()
            );
            assert!(
                ids == expected,
                "{sink}: ids differ from the {} expected ones",
                expected.len()
            );
        }
    }

    /// The leases of the job in the store: (subtask, member) pairs.
    pub fn leases(&self) -> Vec<(i32, String)> {
        Services::get()
            .psql(&format!(
                "SELECT subtask, member FROM ratchet_subtask_leases WHERE job = '{}' AND expires_at > now() \
                 ORDER BY subtask",
                self.name
            ))
            .lines()
            .filter_map(|l| l.split_once('|'))
            .map(|(s, m)| (s.parse().unwrap(), m.to_string()))
            .collect()
    }

    /// Waits until `subtasks` leases are held by `members` distinct processes.
    pub fn wait_spread(&self, subtasks: usize, members: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let leases = self.leases();
            let mut holders: Vec<&String> = leases.iter().map(|(_, m)| m).collect();
            holders.sort();
            holders.dedup();
            if leases.len() == subtasks && holders.len() == members {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "leases not spread over {members} processes within {within:?}: {leases:?}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// Creates `topic` with `partitions` partitions on the test cluster.
pub async fn create_topic(topic: &str, partitions: i32) {
    for result in admin()
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .unwrap()
    {
        result.unwrap();
    }
}

fn admin() -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", Services::get().kafka_bootstrap())
        .create()
        .unwrap()
}

/// The ids of a verifier's JSON list, sorted.
pub fn sorted_ids(ids: &serde_json::Value) -> Vec<i64> {
    let mut ids: Vec<i64> = ids
        .as_array()
        .expect("a list of ids")
        .iter()
        .map(|i| i.as_i64().expect("an integer id"))
        .collect();
    ids.sort_unstable();
    ids
}
