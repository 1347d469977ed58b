//! JSON Schema through the registry (`decoding = { kind = "json-schema" }`), through the binary: records written by
//! confluent-kafka's JSONSerializer (each validated by the producer) and one that violates the schema (written
//! unvalidated), read by a job killed with SIGKILL mid-stream. Every valid record reaches every sink once with its
//! values as written (psql and the Kafka copy read back value by value); the violating one is dead-lettered once,
//! naming the violation and its position; `check-config` prints the schema's columns. A new version of the schema
//! with a new property, with `evolution = "add-columns"` on every sink, adds the column everywhere through a
//! SIGKILL.

use crate::common;

use std::time::Duration;

use common::Job;
use serde_json::{Value, json};
use test_support::Services;

/// An order: `id` (required integer), `note`, `amount` (Kafka Connect's decimal annotation: scale 2, precision 12),
/// `at` (date-time),
/// `customer` (an object with `email`), `tags` (strings). Properties are written out of alphabetical order: the
/// columns follow the schema.
const SCHEMA: &str = r#"{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "Order",
  "type": "object",
  "required": ["id", "amount"],
  "additionalProperties": false,
  "properties": {
    "id": {"type": "integer"},
    "note": {"type": ["string", "null"]},
    "amount": {"type": "number", "title": "org.apache.kafka.connect.data.Decimal",
               "connect.parameters": {"scale": "2", "connect.decimal.precision": "12"}},
    "at": {"type": "string", "format": "date-time"},
    "customer": {"type": "object", "properties": {"email": {"type": "string"}}},
    "tags": {"type": "array", "items": {"type": "string"}}
  }
}"#;

fn order(id: i64) -> Value {
    json!({
        "id": id,
        "note": if id % 5 == 0 { Value::Null } else { json!(format!("n{id}")) },
        "amount": format!("{}.{:02}", id * 7, id % 100).parse::<f64>().unwrap(),
        "at": format!("2026-12-05T10:{:02}:{:02}.{:06}Z", (id / 60) % 60, id % 60, id * 11),
        "customer": {"email": format!("user{id}@example.com")},
        "tags": (0..id % 3).map(|t| format!("t{t}")).collect::<Vec<_>>(),
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn registry_json_schema_lands_every_valid_record_once_through_sigkill_and_dead_letters_a_violation()
 {
    let mut job = Job::with_sections("jsonschema", 2, 2, "3s", |name| {
        format!("\n[dead_letter]\ntopic = \"{name}-dead\"\n")
    })
    .await;
    job.read_registry_json_schema();
    job.store_locally();
    let services = Services::get();
    let bad = 150;
    let first: Vec<Value> = (0..bad).map(order).collect();
    let schema_id = job.produce_json_schema(SCHEMA, &first, true);
    // An amount that is not a number and a customer that is not an object: the producer skipped validation.
    let violation = json!({"id": bad, "amount": "n/a", "customer": "someone"});
    assert_eq!(
        job.produce_json_schema(SCHEMA, &[violation], false),
        schema_id
    );
    let rest: Vec<Value> = (bad + 1..400).map(order).collect();
    job.produce_json_schema(SCHEMA, &rest, true);

    let check = job.ratchet("check-config");
    let printed = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{printed}");
    let line = printed
        .lines()
        .find_map(|l| l.strip_prefix("ok    source columns: "))
        .unwrap_or_else(|| panic!("no source columns in {printed}"));
    for column in [
        "id Int64 not null",
        "note Utf8",
        "amount Decimal128(12, 2) not null",
        "at Timestamp(",
        "customer Struct",
        "tags List",
    ] {
        assert!(line.contains(column), "{column} in {line}");
    }
    let places: Vec<usize> = ["id ", "note ", "amount ", "at ", "customer ", "tags "]
        .iter()
        .map(|c| line.find(c).unwrap())
        .collect();
    assert!(
        places.windows(2).all(|w| w[0] < w[1]),
        "columns out of the schema's order: {line}"
    );

    let mut worker = job.spawn_worker(&[]);
    job.wait_copied(100, Duration::from_secs(90));
    worker.kill9();
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));

    let expected: Vec<i64> = (0..400).filter(|id| *id != bad).collect();
    job.assert_holds(&expected);

    // PostgreSQL (psql): each scalar value as written, the amount an exact numeric(12,2).
    let rows = services.psql(&format!(
        "SELECT id, coalesce(note, '<null>'), amount::text, \
         to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), format_type(a.atttypid, a.atttypmod) \
         FROM \"{t}\", pg_attribute a WHERE a.attrelid = '\"{t}\"'::regclass AND a.attname = 'amount' ORDER BY id",
        t = job.table
    ));
    let rows: Vec<Vec<&str>> = rows.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), expected.len());
    for (row, id) in rows.iter().zip(&expected) {
        let written = order(*id);
        assert_eq!(row[0], id.to_string());
        assert_eq!(
            row[1],
            written["note"].as_str().unwrap_or("<null>"),
            "{row:?}"
        );
        assert_eq!(row[2], format!("{}.{:02}", id * 7, id % 100), "{row:?}");
        assert_eq!(row[3], written["at"].as_str().unwrap(), "{row:?}");
        assert_eq!(row[4], "numeric(12,2)");
    }

    // Kafka (read_committed): the nested values as written.
    for value in job.copy_values() {
        let id = value["id"].as_i64().unwrap();
        let written = order(id);
        assert_eq!(value["customer"], written["customer"], "{value}");
        assert_eq!(value["tags"], written["tags"], "{value}");
    }

    // The violation: dead-lettered once, naming the schema id, each violation's place and the record's position.
    let dead = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), &format!("{}-dead", job.name)],
    );
    let letters = dead["records"].as_array().unwrap();
    assert_eq!(letters.len(), 1, "{dead}");
    let headers = &letters[0]["headers"];
    let error = headers["ratchet.error"].as_str().unwrap();
    assert!(
        error.contains(&format!("violates JSON Schema id {schema_id}"))
            && error.contains("/amount")
            && error.contains("/customer"),
        "{error}"
    );
    let source = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), &job.topic],
    );
    let original = source["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == json!(bad.to_string()))
        .unwrap();
    assert_eq!(
        (
            headers["ratchet.source.partition"].as_str(),
            headers["ratchet.source.offset"].as_str()
        ),
        (
            Some(original["partition"].to_string().as_str()),
            Some(original["offset"].to_string().as_str())
        ),
        "{headers}"
    );
}

/// A closed order schema (`additionalProperties` false): `id`, `note`, and with `qty` the optional `qty`, which a
/// BACKWARD compatibility rule accepts as the next version.
fn closed_schema(qty: bool) -> String {
    let mut properties = json!({"id": {"type": "integer"}, "note": {"type": "string"}});
    if qty {
        properties["qty"] = json!({"type": "integer"});
    }
    json!({"type": "object", "required": ["id"], "additionalProperties": false, "properties": properties})
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_json_schema_property_becomes_a_column_in_every_sink_through_sigkill() {
    let mut job = Job::new("jsonevolve", 2, 2, "3s").await;
    job.read_registry_json_schema();
    job.evolve_every_sink();
    let services = Services::get();
    let first: Vec<Value> = (0..150)
        .map(|id| json!({"id": id, "note": format!("n{id}")}))
        .collect();
    job.produce_json_schema(&closed_schema(false), &first, true);
    let mut worker = job.spawn_worker(&[]);
    job.wait_copied(150, Duration::from_secs(90));
    let second: Vec<Value> = (150..300)
        .map(|id| json!({"id": id, "note": format!("n{id}"), "qty": id}))
        .collect();
    job.produce_json_schema(&closed_schema(true), &second, true);
    job.wait_copied(200, Duration::from_secs(90));
    worker.kill9();
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));

    job.assert_holds(&(0..300).collect::<Vec<_>>());
    // PostgreSQL (psql): the new column, null before the new version, each record's own value after it.
    let summary = services.psql(&format!(
        "SELECT count(*) FILTER (WHERE qty IS NULL AND id < 150), count(*) FILTER (WHERE qty = id AND id >= 150), \
         count(*) FILTER (WHERE note = 'n' || id) FROM \"{}\"",
        job.table
    ));
    assert_eq!(summary.trim(), "150|150|300");
    // Kafka (read_committed): the new field in the records of the new version.
    for value in job.copy_values() {
        let id = value["id"].as_i64().unwrap();
        let qty = value.get("qty").filter(|q| !q.is_null());
        assert_eq!(qty.cloned(), (id >= 150).then(|| json!(id)), "{value}");
    }
}

/// The order schema of the evolve test: version 1 requires `note`, its `customer` has a name; version 2 makes
/// `note` optional and adds the customer's `email` (objects closed, so a BACKWARD rule accepts it).
fn nested_schema(evolved: bool) -> String {
    let mut customer = json!({"name": {"type": "string"}});
    if evolved {
        customer["email"] = json!({"type": "string"});
    }
    let required = match evolved {
        true => json!(["id"]),
        false => json!(["id", "note"]),
    };
    json!({"type": "object", "required": required, "additionalProperties": false, "properties": {
        "id": {"type": "integer"}, "note": {"type": "string"},
        "customer": {"type": "object", "additionalProperties": false, "required": ["name"],
            "properties": customer}}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn json_schema_properties_made_optional_or_added_inside_objects_change_every_sink_killed_at_the_change()
 {
    let mut job = Job::new("jsonwiden", 2, 2, "3s").await;
    job.read_registry_json_schema();
    job.set_every_sink_evolution("evolve");
    let services = Services::get();
    let first: Vec<Value> = (0..100)
        .map(|id| json!({"id": id, "note": format!("n{id}"), "customer": {"name": format!("c{id}")}}))
        .collect();
    job.produce_json_schema(&nested_schema(false), &first, true);
    let mut worker = job.spawn_worker_with_env(&[], &[("RATCHET_KILL_AT", "before-evolve:1")]);
    job.wait_copied(100, Duration::from_secs(90));
    let second: Vec<Value> = (100..200)
        .map(|id| {
            let mut record = json!({"id": id, "customer": {"name": format!("c{id}"), "email": format!("e{id}")}});
            if id % 2 == 0 {
                record["note"] = json!(format!("n{id}"));
            }
            record
        })
        .collect();
    job.produce_json_schema(&nested_schema(true), &second, true);
    worker.wait_killed(Duration::from_secs(90));
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));

    job.assert_holds(&(0..200).collect::<Vec<_>>());
    let summary = services.psql(&format!(
        "SELECT count(*) FILTER (WHERE id < 100 AND note = 'n' || id AND customer->>'email' IS NULL), \
                count(*) FILTER (WHERE id >= 100 AND (note IS NULL) = (id % 2 = 1) AND customer->>'email' = 'e' || id), \
                count(*) FILTER (WHERE customer->>'name' = 'c' || id) FROM \"{}\"",
        job.table
    ));
    assert_eq!(summary.trim(), "100|100|200");
    // pyiceberg: note null exactly where version 2 left it out, the customer's email after the change.
    let lake = job.read_lake(&["--columns"]);
    let notes: Vec<i64> = (0..200).filter(|id| *id < 100 || id % 2 == 0).collect();
    assert_eq!(lake["columns"]["note"], json!(notes));
}
