//! Protobuf through the registry (`decoding = { kind = "protobuf" }`), through the binary: messages written by
//! confluent-kafka's ProtobufSerializer (the `.proto` compiled by protoc, as an application's generated classes
//! are), read by a job on the local checkpoint store killed with SIGKILL mid-stream. Every record reaches every sink
//! once with its values as written (psql and the Kafka copy read back value by value: well-known types, an enum,
//! a message from an imported file (a schema reference resolved through the registry), repeated and map fields,
//! `optional` presence, a `oneof`); one whose timestamp has nanoseconds
//! (which no microsecond column holds) is dead-lettered once naming the field; `check-config` prints the message's
//! columns. A new version of the message with a new field, with `evolution = "add-columns"` on every sink, adds the
//! column everywhere through a SIGKILL. Keys written as Protobuf messages (the key message second in its file, so
//! its message-index path is `[1]`) become key columns.

use crate::common;

use std::time::Duration;

use common::Job;
use serde_json::{Value, json};
use test_support::Services;

const ORDER: &str = r#"syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "shop/customer.proto";

message Order {
  int64 id = 1;
  optional string note = 2;
  google.protobuf.Timestamp at = 3;
  enum Status { STATUS_NEW = 0; STATUS_PAID = 1; STATUS_SHIPPED = 2; }
  Status status = 4;
  Customer customer = 5;
  repeated string tags = 6;
  map<string, int64> counts = 7;
  google.protobuf.Int64Value discount = 8;
  oneof payment { string card = 9; string iban = 10; }
}
"#;

/// Imported by [`ORDER`]: the serializer registers it under its own subject, and the order's schema refers to it.
const CUSTOMER: &str = r#"syntax = "proto3";
package shop;
message Customer { string email = 1; uint32 visits = 2; }
"#;

const STATUSES: [&str; 3] = ["STATUS_NEW", "STATUS_PAID", "STATUS_SHIPPED"];

/// Order `id` in Protobuf's JSON mapping.
fn order(id: i64) -> Value {
    let mut order = json!({
        "id": id,
        "at": format!("2026-12-05T10:{:02}:{:02}.{:06}Z", (id / 60) % 60, id % 60, id * 11),
        "status": STATUSES[(id % 3) as usize],
        "customer": {"email": format!("user{id}@example.com"), "visits": id},
        "tags": (0..id % 3).map(|t| format!("t{t}")).collect::<Vec<_>>(),
        "counts": {"a": id, "b": -id},
    });
    if id % 5 != 0 {
        order["note"] = json!(format!("n{id}"));
    }
    if id % 4 != 0 {
        order["discount"] = json!(id * 10);
    }
    if id % 2 == 0 {
        order["card"] = json!(format!("card{id}"));
    } else {
        order["iban"] = json!(format!("iban{id}"));
    }
    order
}

#[tokio::test(flavor = "multi_thread")]
async fn registry_protobuf_lands_every_record_once_through_sigkill_and_dead_letters_what_would_change()
 {
    let mut job = Job::with_sections("protobuf", 2, 2, "3s", |name| {
        format!("\n[dead_letter]\ntopic = \"{name}-dead\"\n")
    })
    .await;
    job.read_registry_protobuf();
    job.store_locally();
    let services = Services::get();
    let bad = 150;
    let first: Vec<Value> = (0..bad).map(order).collect();
    let schema_id = job.produce_protobuf(
        ORDER,
        "shop.Order",
        &first,
        &[("shop/customer.proto", CUSTOMER)],
    );
    // A timestamp with nanoseconds: valid Protobuf, but no microsecond column holds it.
    let mut nanos = order(bad);
    nanos["at"] = json!("2026-12-05T10:00:00.000000001Z");
    assert_eq!(
        job.produce_protobuf(
            ORDER,
            "shop.Order",
            &[nanos],
            &[("shop/customer.proto", CUSTOMER)]
        ),
        schema_id
    );
    let rest: Vec<Value> = (bad + 1..400).map(order).collect();
    job.produce_protobuf(
        ORDER,
        "shop.Order",
        &rest,
        &[("shop/customer.proto", CUSTOMER)],
    );

    let check = job.ratchet("check-config");
    let printed = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{printed}");
    let line = printed
        .lines()
        .find_map(|l| l.strip_prefix("ok    source columns: "))
        .unwrap_or_else(|| panic!("no source columns in {printed}"));
    let columns = [
        "id Int64 not null",
        "note Utf8",
        "at Timestamp(",
        "status Dictionary(Int32, Utf8) not null",
        "customer Struct",
        "tags List",
        "counts Map",
        "discount Int64",
        "card Utf8",
        "iban Utf8",
    ];
    let mut last = 0;
    for column in columns {
        let place = line
            .find(column)
            .unwrap_or_else(|| panic!("{column} in {line}"));
        assert!(place >= last, "columns out of the message's order: {line}");
        last = place;
    }

    let mut worker = job.spawn_worker(&[]);
    job.wait_copied(100, Duration::from_secs(90));
    worker.kill9();
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));

    let expected: Vec<i64> = (0..400).filter(|id| *id != bad).collect();
    job.assert_holds(&expected);

    // PostgreSQL (psql): each value as written; unset `optional` and wrapper fields null, the unset oneof member
    // null.
    let rows = services.psql(&format!(
        "SELECT id, coalesce(note, '<null>'), \
         to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), status, customer->>'email', \
         customer->>'visits', coalesce(discount::text, '<null>'), coalesce(card, '<null>'), coalesce(iban, '<null>') \
         FROM \"{}\" ORDER BY id",
        job.table
    ));
    let rows: Vec<Vec<&str>> = rows.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), expected.len());
    let or_null = |v: &Value| v.as_str().map_or("<null>".to_string(), str::to_string);
    for (row, id) in rows.iter().zip(&expected) {
        let written = order(*id);
        let want = [
            id.to_string(),
            or_null(&written["note"]),
            or_null(&written["at"]),
            or_null(&written["status"]),
            or_null(&written["customer"]["email"]),
            id.to_string(),
            written["discount"]
                .as_i64()
                .map_or("<null>".into(), |d| d.to_string()),
            or_null(&written["card"]),
            or_null(&written["iban"]),
        ];
        assert_eq!(row, &want, "order {id}");
    }

    // Kafka (read_committed): the repeated and map fields as written.
    let copies = job.copy_values();
    assert_eq!(copies.len(), expected.len());
    for value in copies {
        let id = value["id"].as_i64().unwrap();
        let written = order(id);
        assert_eq!(value["tags"], written["tags"], "{value}");
        assert_eq!(value["counts"], written["counts"], "{value}");
        assert_eq!(value["status"], written["status"], "{value}");
    }

    // The nanosecond timestamp: dead-lettered once, naming the field and the record's position.
    let dead = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), &format!("{}-dead", job.name)],
    );
    let letters = dead["records"].as_array().unwrap();
    assert_eq!(letters.len(), 1, "{dead}");
    let headers = &letters[0]["headers"];
    let error = headers["ratchet.error"].as_str().unwrap();
    assert!(
        error.contains("field `at`") && error.contains("nanoseconds"),
        "{error}"
    );
    assert_eq!(letters[0]["key"], json!(bad.to_string()), "{dead}");
}

/// The order message: `id`, `note`, and with `qty` the new field 3.
fn evolving_order(qty: bool) -> String {
    let qty = if qty { "optional int64 qty = 3;" } else { "" };
    format!(
        "syntax = \"proto3\";\npackage shop;\nmessage Order {{ int64 id = 1; string note = 2; {qty} }}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_protobuf_field_becomes_a_column_in_every_sink_through_sigkill() {
    let mut job = Job::new("protoevolve", 2, 2, "3s").await;
    job.read_registry_protobuf();
    job.evolve_every_sink();
    let services = Services::get();
    let first: Vec<Value> = (0..150)
        .map(|id| json!({"id": id, "note": format!("n{id}")}))
        .collect();
    job.produce_protobuf(&evolving_order(false), "shop.Order", &first, &[]);
    let mut worker = job.spawn_worker(&[]);
    job.wait_copied(150, Duration::from_secs(90));
    let second: Vec<Value> = (150..300)
        .map(|id| json!({"id": id, "note": format!("n{id}"), "qty": id}))
        .collect();
    job.produce_protobuf(&evolving_order(true), "shop.Order", &second, &[]);
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

#[tokio::test(flavor = "multi_thread")]
async fn a_protobuf_field_renamed_keeps_its_column_by_number_across_a_kill_and_restart() {
    let mut job = Job::new("protorename", 2, 2, "3s").await;
    job.read_registry_protobuf();
    // With add-columns, a rename taken for a new field would add a column: it must not.
    job.evolve_every_sink();
    let services = Services::get();
    let first: Vec<Value> = (0..150)
        .map(|id| json!({"id": id, "note": format!("n{id}"), "qty": id}))
        .collect();
    job.produce_protobuf(&evolving_order(true), "shop.Order", &first, &[]);
    let mut worker = job.spawn_worker(&[]);
    job.wait_copied(150, Duration::from_secs(90));
    // Field 3 renamed while the job runs; the kill leaves some of it uncommitted, replayed by a process that reads
    // with the renamed version: the column keeps the name of version 1.
    let renamed = evolving_order(true).replace("qty = 3", "quantity = 3");
    let second: Vec<Value> = (150..300)
        .map(|id| json!({"id": id, "note": format!("n{id}"), "quantity": id}))
        .collect();
    job.produce_protobuf_with_compatibility(&renamed, "shop.Order", &second, "NONE");
    job.wait_copied(200, Duration::from_secs(90));
    worker.kill9();
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));
    assert!(
        !worker.log_text().contains("the source's schema changed"),
        "{}",
        worker.log_text()
    );

    job.assert_holds(&(0..300).collect::<Vec<_>>());
    let table = services.verify(
        "sql_values.py",
        &["pg", services.pg_url(), &job.table, "id"],
    );
    assert_eq!(table["columns"], json!(["id", "note", "qty"]), "{table}");
    for row in table["rows"].as_array().unwrap() {
        assert_eq!(row["qty"], row["id"], "{row}");
    }
    for value in job.copy_values() {
        assert_eq!(value["qty"], value["id"], "{value}");
    }
}

/// The order message of the widening test: version 1 with `int32 qty`, `float ratio` and a `Customer` of a name;
/// version 2 with `int64 qty`, `double ratio` and the customer's `email` (field 2 of the nested message).
fn typed_order(wide: bool) -> String {
    let (qty, ratio, email) = match wide {
        true => ("int64", "double", "string email = 2;"),
        false => ("int32", "float", ""),
    };
    format!(
        "syntax = \"proto3\";\npackage shop;\nmessage Order {{ int64 id = 1; string note = 2; {qty} qty = 3; \
         {ratio} ratio = 4; message Customer {{ string name = 1; {email} }} Customer customer = 5; }}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn protobuf_fields_widened_or_added_inside_a_message_change_every_sink_killed_at_the_change()
{
    let mut job = Job::new("protowiden", 2, 2, "3s").await;
    job.read_registry_protobuf();
    job.set_every_sink_evolution("evolve");
    let services = Services::get();
    let first: Vec<Value> = (0..100)
        .map(|id| {
            json!({"id": id, "note": format!("n{id}"), "qty": id, "ratio": id as f64 + 0.25,
                "customer": {"name": format!("c{id}")}})
        })
        .collect();
    job.produce_protobuf(&typed_order(false), "shop.Order", &first, &[]);
    let mut worker = job.spawn_worker_with_env(&[], &[("RATCHET_KILL_AT", "after-evolve:1")]);
    job.wait_copied(100, Duration::from_secs(90));
    let second: Vec<Value> = (100..200)
        .map(|id| {
            json!({"id": id, "note": format!("n{id}"), "qty": (id as i64 * 10_000_000_000).to_string(),
                "ratio": format!("{id}.1").parse::<f64>().unwrap(),
                "customer": {"name": format!("c{id}"), "email": format!("e{id}")}})
        })
        .collect();
    // Apicurio's BACKWARD rule calls int32 to int64 a changed field type: the subject takes it with NONE.
    job.produce_protobuf_with_compatibility(&typed_order(true), "shop.Order", &second, "NONE");
    worker.wait_killed(Duration::from_secs(90));
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));

    job.assert_holds(&(0..200).collect::<Vec<_>>());
    // PostgreSQL (psql): the widened columns hold both versions' values exactly, the customer its new field.
    let summary = services.psql(&format!(
        "SELECT count(*) FILTER (WHERE id < 100 AND qty = id AND ratio = id + 0.25 AND customer->>'email' IS NULL), \
                count(*) FILTER (WHERE id >= 100 AND qty = id * 10000000000 \
                    AND ratio::text = (id::text || '.1')::float8::text AND customer->>'email' = 'e' || id), \
                count(*) FILTER (WHERE customer->>'name' = 'c' || id) FROM \"{}\"",
        job.table
    ));
    assert_eq!(summary.trim(), "100|100|200");
    let types = services.psql(&format!(
        "SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attname) \
         FROM pg_attribute WHERE attrelid = '\"{}\"'::regclass AND attname IN ('qty', 'ratio')",
        job.table
    ));
    assert_eq!(types.trim(), "qty bigint, ratio double precision");
    // pyiceberg: the nested field is a column of the customer struct, null before version 2.
    let lake = job.read_lake(&["--rows"]);
    let names: Vec<&str> = lake["column_names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let (id_at, qty_at, customer_at) = (
        names.iter().position(|n| *n == "id").unwrap(),
        names.iter().position(|n| *n == "qty").unwrap(),
        names.iter().position(|n| *n == "customer").unwrap(),
    );
    for row in lake["rows"].as_array().unwrap() {
        let id = row[id_at].as_i64().unwrap();
        let qty = if id < 100 { id } else { id * 10_000_000_000 };
        assert_eq!(row[qty_at].as_i64(), Some(qty), "{row}");
        let email = (id >= 100).then(|| format!("e{id}"));
        assert_eq!(
            row[customer_at]["email"].as_str(),
            email.as_deref(),
            "{row}"
        );
    }
}

/// An order and its key message, second in the file (the key's message-index path is `[1]`).
const KEYED: &str = r#"syntax = "proto3";
package shop;
message Order { int64 id = 1; string note = 2; }
message OrderKey { int64 id = 1; }
"#;

#[tokio::test(flavor = "multi_thread")]
async fn protobuf_keys_become_key_columns() {
    let mut job = Job::new("protokey", 1, 2, "3s").await;
    job.read_registry_protobuf();
    job.set_decoding(r#"{ kind = "protobuf", record_name = "shop.Order" }"#);
    let text = std::fs::read_to_string(&job.config).unwrap();
    std::fs::write(
        &job.config,
        text.replace(
            "[source.registry]",
            "[source.metadata]\nkey = \"k\"\nkey_decoding = { kind = \"protobuf\", record_name = \"shop.OrderKey\" }\n\n[source.registry]",
        ),
    )
    .unwrap();
    let services = Services::get();
    let records: Vec<Value> = (0..50)
        .map(|id| json!({"id": id, "note": format!("n{id}")}))
        .collect();
    job.produce_protobuf_keyed(KEYED, "shop.Order", "shop.OrderKey", &records);
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));
    job.assert_holds(&(0..50).collect::<Vec<_>>());
    // PostgreSQL (psql): each row's key column holds the id its key message carried.
    let summary = services.psql(&format!(
        "SELECT count(*) FILTER (WHERE k_id = id), count(*) FROM \"{}\"",
        job.table
    ));
    assert_eq!(summary.trim(), "50|50");
}
