//! Transforms through the binary (`[[transforms]]` and a sink's `select`), read back by the independent readers:
//! a PII-masking job (an email hashed, a card number dropped, an amount cast to a decimal, test traffic filtered)
//! into every sink with a PII-free `select` for Kafka, killed with SIGKILL and restarted, every transformed row
//! exactly once and each value as computed independently; a failing cast dead-lettered with its record's
//! position, or stopping the job without a dead-letter topic; and `check-config` printing the schemas and
//! refusing what a transform must not do.

use crate::common;

use std::time::Duration;

use common::Job;
use test_support::Services;

/// The order records: `{"id", "email", "card", "amount", "test"}`; every 10th is test traffic, and the amount of
/// `bad` (if any) is not a number.
fn order(id: i64, bad: Option<i64>) -> Vec<u8> {
    let amount = if Some(id) == bad {
        "n/a".to_string()
    } else {
        format!("{}.{:02}", id * 3, id % 100)
    };
    serde_json::json!({
        "id": id,
        "email": format!("user{id}@example.com"),
        "card": format!("4111-1111-1111-{:04}", id % 10_000),
        "amount": amount,
        "test": id % 10 == 7,
    })
    .to_string()
    .into_bytes()
}

const DECODING: &str = r#"{ kind = "json", fields = [ { name = "id", type = "int64", nullable = false }, { name = "email", type = "string" }, { name = "card", type = "string" }, { name = "amount", type = "string" }, { name = "test", type = "boolean" } ] }"#;

const MASK: &str = r#"
[[transforms]]
name = "mask"
sql = """
SELECT id, encode(sha256(email), 'hex') AS email_hash, CAST(amount AS DECIMAL(12, 2)) AS amount
FROM input WHERE NOT test
"""
"#;

/// The job: the masking transform in front of every sink, and the Kafka copy's `select` leaving only the id and
/// the hash.
async fn masking_job(prefix: &str, dead_letter: bool) -> Job {
    let job = Job::with_sections(prefix, 2, 2, "3s", |name| {
        let mut extra = MASK.to_string();
        if dead_letter {
            extra += &format!("\n[dead_letter]\ntopic = \"{name}-dead\"\n");
        }
        extra
    })
    .await;
    job.set_decoding(DECODING);
    job.edit_config(
        "id = \"copy\"\n",
        "id = \"copy\"\nselect = \"SELECT id, email_hash FROM input\"\n",
    );
    job
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_masking_job_lands_every_transformed_row_once_through_sigkill() {
    let bad = 123;
    let mut job = masking_job("mask", true).await;
    // The store a new user starts with.
    job.store_locally();
    let services = Services::get();
    job.produce_encoded(400, |id| order(id, Some(bad))).await;
    let mut worker = job.spawn_worker(&[]);
    job.wait_copied(100, Duration::from_secs(90));
    worker.kill9();
    job.produce_encoded(400, |id| order(id, Some(bad))).await;
    let mut worker = job.spawn_worker(&[]);
    job.wait_copied(500, Duration::from_secs(90));
    worker.kill9();
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));

    // Test traffic filtered out; the record whose amount is not a number dead-lettered, reaching no sink.
    let expected: Vec<i64> = (0..800).filter(|id| id % 10 != 7 && *id != bad).collect();
    job.assert_holds(&expected);

    // PostgreSQL (psql): the hash and the exact decimal of each row, and no email or card column.
    let rows = services.psql(&format!(
        "SELECT id, email_hash, amount::text, format_type(a.atttypid, a.atttypmod) FROM \"{t}\", \
         pg_attribute a WHERE a.attrelid = '\"{t}\"'::regclass AND a.attname = 'amount' ORDER BY id",
        t = job.table
    ));
    let rows: Vec<Vec<&str>> = rows.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), expected.len());
    for (row, id) in rows.iter().zip(&expected) {
        assert_eq!(row[0], id.to_string());
        assert_eq!(
            row[1],
            sha256_hex(&format!("user{id}@example.com")),
            "{row:?}"
        );
        assert_eq!(row[2], format!("{}.{:02}", id * 3, id % 100), "{row:?}");
        assert_eq!(row[3], "numeric(12,2)");
    }
    let columns = services.psql(&format!(
        "SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM information_schema.columns \
         WHERE table_name = '{}'",
        job.table
    ));
    assert_eq!(columns.trim(), "id,email_hash,amount");

    // Kafka (read_committed): the select's two columns only.
    for value in job.copy_values() {
        let id = value["id"].as_i64().unwrap();
        assert_eq!(
            value,
            serde_json::json!({"id": id, "email_hash": sha256_hex(&format!("user{id}@example.com"))})
        );
    }

    // The dead letter: once, naming the transform, the expression and the record's position.
    let dead = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), &format!("{}-dead", job.name)],
    );
    let letters = dead["records"].as_array().unwrap();
    assert_eq!(letters.len(), 1, "{dead}");
    let letter = &letters[0];
    let error = letter["headers"]["ratchet.error"].as_str().unwrap();
    assert!(
        error.contains("transform \"mask\"") && error.contains("CAST") && error.contains("n/a"),
        "{error}"
    );
    assert!(letter["headers"]["ratchet.sink"].is_null(), "{letter}");
    assert_eq!(
        letter["headers"]["ratchet.source.topic"],
        job.topic.as_str()
    );
    let value: serde_json::Value = serde_json::from_str(letter["value"].as_str().unwrap()).unwrap();
    assert_eq!(value["id"], bad);
    assert_eq!(value["amount"], "n/a");
    // The position it names holds that record (read back from the source topic).
    let source = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), &job.topic],
    );
    let partition: i64 = letter["headers"]["ratchet.source.partition"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let offset: i64 = letter["headers"]["ratchet.source.offset"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let named = source["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["partition"] == partition && r["offset"] == offset)
        .unwrap();
    let named: serde_json::Value = serde_json::from_str(named["value"].as_str().unwrap()).unwrap();
    assert_eq!(named["id"], bad, "{named}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_dead_letter_topic_a_failing_cast_stops_the_job_naming_it() {
    let mut job = masking_job("maskstop", false).await;
    job.produce_encoded(20, |id| order(id, Some(5))).await;
    let mut worker = job.spawn_worker(&[]);
    let log = worker.wait_failed(Duration::from_secs(90));
    assert!(
        log.contains("transform \"mask\"") && log.contains("CAST") && log.contains("TRY_CAST"),
        "{log}"
    );
    assert!(
        log.contains(&format!("{}/", job.topic)) && log.contains('@'),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn check_config_prints_the_schemas_and_refuses_what_transforms_must_not_do() {
    let job = masking_job("maskcheck", true).await;
    let out = job.ratchet("check-config");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(
            "ok    transform mask: id Int64 not null, email_hash Utf8, amount Decimal128(12, 2)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "sink copy (kafka, exactly-once) receives: id Int64 not null, email_hash Utf8"
        ),
        "{text}"
    );
    assert!(
        !text.contains("__ratchet"),
        "hidden columns are not shown: {text}"
    );

    let refusals = [
        (
            "CAST(amount AS DECIMAL(12, 2))",
            "now()",
            "not deterministic",
        ),
        (
            "CAST(amount AS DECIMAL(12, 2))",
            "random()",
            "not deterministic",
        ),
        (
            "FROM input WHERE NOT test",
            "FROM input GROUP BY id, email, amount",
            "aggregate",
        ),
        (
            "FROM input WHERE NOT test",
            "FROM input WHERE NOT test ORDER BY id",
            "ORDER BY",
        ),
    ];
    for (from, to, says) in refusals {
        job.edit_config(from, to);
        let out = job.ratchet("check-config");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{to}: {text}");
        assert!(
            text.contains("FAIL") && text.contains("transform \"mask\"") && text.contains(says),
            "{to}: {text}"
        );
        job.edit_config(to, from);
    }

    // A keyed sink: the database upserts by id; a transform that computes the key is refused, naming both.
    job.edit_config(
        "create_table = true\n\n[[sinks]]\ntype = \"iceberg\"",
        "create_table = true\nmode = { kind = \"upsert\", key = [\"id\"] }\n\n[[sinks]]\ntype = \"iceberg\"",
    );
    let out = job.ratchet("check-config");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    job.edit_config("SELECT id, encode", "SELECT id + 1 AS id, encode");
    let out = job.ratchet("check-config");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("sink db writes rows by the key column \"id\"") && text.contains("computes"),
        "{text}"
    );
    job.edit_config("SELECT id + 1 AS id, encode", "SELECT encode");
    job.edit_config(
        "SELECT id, email_hash FROM input",
        "SELECT email_hash FROM input",
    );
    let out = job.ratchet("check-config");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("key column \"id\"") && text.contains("drops"),
        "{text}"
    );
}

/// An `Order` with a nested `customer` record, then `extra` optional fields.
fn nested_order_schema(extra: &[(&str, &str)]) -> String {
    let mut fields = vec![
        serde_json::json!({"name": "id", "type": "long"}),
        serde_json::json!({"name": "note", "type": ["null", "string"], "default": null}),
        serde_json::json!({"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "name", "type": "string"},
            {"name": "city", "type": ["null", "string"], "default": null},
        ]}}),
    ];
    fields.extend(extra.iter().map(
        |(name, kind)| serde_json::json!({"name": name, "type": ["null", kind], "default": null}),
    ));
    serde_json::json!({"type": "record", "name": "Order", "namespace": "ratchet.test", "fields": fields})
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn nested_avro_is_flattened_and_a_new_field_reaches_select_star_across_a_kill() {
    let mut job = Job::with_sections("flatten", 2, 2, "3s", |_| {
        r#"
[[transforms]]
name = "flatten"
sql = "SELECT * EXCLUDE (customer), customer['name'] AS customer_name, customer['city'] AS customer_city FROM input"
"#
        .to_string()
    })
    .await;
    job.read_registry_avro();
    job.evolve_every_sink();
    // The Kafka copy names its columns: a new source field does not reach it.
    job.edit_config(
        "id = \"copy\"\n",
        "id = \"copy\"\nselect = \"SELECT id, customer_name FROM input\"\n",
    );
    let customer = |id: u64| serde_json::json!({"customer": {"name": format!("c{id}"), "city": if id.is_multiple_of(2) { serde_json::Value::Null } else { format!("city{id}").into() }}});
    job.produce_avro(&nested_order_schema(&[]), 100, customer);

    // Killed once the first records are in, with the second schema's records waiting.
    let mut worker = job.spawn_worker_with_env(&[], &[("RATCHET_KILL_AT", "before-evolve:1")]);
    job.wait_copied(100, Duration::from_secs(60));
    job.produce_avro(&nested_order_schema(&[("qty", "long")]), 100, |id| {
        let mut record = customer(id);
        record["qty"] = (id * 10).into();
        record
    });
    worker.wait_killed(Duration::from_secs(90));
    let mut worker = job.spawn_worker(&["--exit-when-idle", "5s"]);
    worker.wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();

    // PostgreSQL: flat columns with each record's values; `qty` added by the evolution, null before it.
    let summary = Services::get().psql(&format!(
        "SELECT count(*) FILTER (WHERE customer_name = 'c' || id), \
                count(*) FILTER (WHERE id % 2 = 0 AND customer_city IS NULL), \
                count(*) FILTER (WHERE id % 2 = 1 AND customer_city = 'city' || id), \
                count(*) FILTER (WHERE id < 100 AND qty IS NULL), \
                count(*) FILTER (WHERE id >= 100 AND qty = id * 10), \
                count(*) FILTER (WHERE note = 'n' || id) FROM \"{}\"",
        job.table
    ));
    assert_eq!(summary.trim(), "200|100|100|100|100|200");
    let columns = Services::get().psql(&format!(
        "SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM information_schema.columns \
         WHERE table_name = '{}'",
        job.table
    ));
    assert_eq!(columns.trim(), "id,note,customer_name,customer_city,qty");
    // Iceberg (pyiceberg): the same flat columns, `qty` only on the records that had it.
    let lake = job.read_lake(&["--columns"]);
    let ids = |from: i64, step: usize| {
        serde_json::Value::from((from..200).step_by(step).collect::<Vec<i64>>())
    };
    assert_eq!(lake["columns"]["customer_name"], ids(0, 1));
    assert_eq!(lake["columns"]["customer_city"], ids(1, 2));
    assert_eq!(lake["columns"]["qty"], ids(100, 1));
    assert!(lake["columns"].get("customer").is_none(), "{lake}");
    // Kafka: the select's two columns, before and after the change.
    for value in job.copy_values() {
        let id = value["id"].as_i64().unwrap();
        assert_eq!(
            value,
            serde_json::json!({"id": id, "customer_name": format!("c{id}")})
        );
    }
}
