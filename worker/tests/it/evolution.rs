//! Schema evolution through `ratchet run`, exactly once across the change: Avro through the schema registry, every
//! sink with `evolution = "add-columns"`. A writer schema that adds a field while the job runs becomes a column of
//! every sink (PostgreSQL `ALTER TABLE`, an Iceberg schema update, new Parquet files, JSON records) at a checkpoint
//! boundary. The process is killed at the first change before any sink evolved, and at a second change after the
//! first sink did; each restart reads the subject's latest schema and the sinks add what they lack when they
//! open. At the end every record is in every sink once (read back by the independent readers), with its own values
//! in the new columns and null where its schema had no such field. With `evolution = "none"` (the default) such a
//! record stops the job, naming the field and both schema ids. Two processes that started on different schema
//! versions write into the same tables at once, each record once. With `evolution = "evolve"`, fields widened
//! (int to long, float to double, decimal precision up), made optional, or added inside a nested record change
//! every sink in place, killed before and after the change likewise. With `evolution = "ignore"` on the table
//! sinks (on the default local store), their tables keep their columns through every change and kill, the new
//! fields left out and counted, while the other sinks of the job take them. A field renamed by Avro aliases (twice),
//! at the top level and inside a nested record, stays on its column within a run, across a kill and in the restart
//! that reads with the renamed schema.

use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::{Job, free_port, order_schema, scrape, total};
use serde_json::{Value, json};
use test_support::Services;

/// Runs the worker with `RATCHET_KILL_AT=<step>:1`; once everything produced so far reached the Kafka copy,
/// produces `count` records of `schema`, and waits until the drill kills the worker at the schema change.
async fn killed_at_the_change(
    job: &mut Job,
    step: &str,
    schema: &str,
    count: u64,
    extra: impl Fn(u64) -> Value,
) {
    let at = format!("{step}:1");
    let mut worker = job.spawn_worker_with_env(&[], &[("RATCHET_KILL_AT", at.as_str())]);
    job.wait_copied(job.produced as usize, Duration::from_secs(60));
    job.produce_avro(schema, count, extra);
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = worker.exited() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the {step} drill never fired:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.signal(), Some(9), "{}", worker.log_text());
    assert!(
        worker.log_text().contains("the source's schema changed"),
        "{}",
        worker.log_text()
    );
    worker.child = None;
}

#[tokio::test(flavor = "multi_thread")]
async fn new_fields_become_columns_of_every_sink_exactly_once_across_kills() {
    let mut job = Job::new("evolve", 2, 2, "3s").await;
    job.read_registry_avro();
    job.evolve_every_sink();
    job.produce_avro(&order_schema(&[]), 100, |_| json!({}));

    let with_qty = order_schema(&[("qty", "long")]);
    killed_at_the_change(
        &mut job,
        "before-evolve",
        &with_qty,
        100,
        |id| json!({ "qty": id }),
    )
    .await;
    let with_tag = order_schema(&[("qty", "long"), ("tag", "string")]);
    killed_at_the_change(
        &mut job,
        "after-evolve",
        &with_tag,
        100,
        |id| json!({ "qty": id, "tag": format!("t{id}") }),
    )
    .await;

    // The last process opens on the latest schema, then meets one more change, which every sink takes while it
    // runs: the checkpoint before it commits, the columns are added, the new batches are written.
    let mut worker = job.spawn_worker(&["--exit-when-idle", "5s"]);
    job.wait_copied(job.produced as usize, Duration::from_secs(60));
    let with_price = order_schema(&[("qty", "long"), ("tag", "string"), ("price", "double")]);
    job.produce_avro(
        &with_price,
        100,
        |id| json!({ "qty": id, "tag": format!("t{id}"), "price": id as f64 / 2.0 }),
    );
    worker.wait_exit(Duration::from_secs(120));
    assert!(
        worker.log_text().contains("sink took the new schema"),
        "{}",
        worker.log_text()
    );
    job.assert_exactly_once();

    // Each row has its own values in the new columns, null where its record's schema had no such field.
    let summary = Services::get().psql(&format!(
        "SELECT count(*) FILTER (WHERE id < 100 AND qty IS NULL AND tag IS NULL AND price IS NULL), \
                count(*) FILTER (WHERE id >= 100 AND id < 200 AND qty = id AND tag IS NULL), \
                count(*) FILTER (WHERE id >= 200 AND id < 300 AND qty = id AND tag = 't' || id AND price IS NULL), \
                count(*) FILTER (WHERE id >= 300 AND price = id / 2.0), \
                count(*) FILTER (WHERE note = 'n' || id) FROM \"{}\"",
        job.table
    ));
    assert_eq!(summary.trim(), "100|100|100|100|400");
    // pyiceberg reads the Iceberg table the same way: each new column holds exactly the ids whose record had it.
    let lake = job.read_lake(&["--columns"]);
    let ids = |from: i64| Value::from((from..400).collect::<Vec<i64>>());
    assert_eq!(lake["columns"]["qty"], ids(100));
    assert_eq!(lake["columns"]["tag"], ids(200));
    assert_eq!(lake["columns"]["price"], ids(300));
}

#[tokio::test(flavor = "multi_thread")]
async fn without_evolution_a_new_field_stops_the_job_naming_it_and_both_ids() {
    let mut job = Job::new("no_evolve", 1, 1, "3s").await;
    job.read_registry_avro();
    job.produce_avro(&order_schema(&[]), 10, |_| json!({}));
    let mut worker = job.spawn_worker(&[]);
    job.wait_copied(10, Duration::from_secs(60));
    job.produce_avro(
        &order_schema(&[("qty", "long")]),
        1,
        |id| json!({ "qty": id }),
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = worker.exited() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the job went on:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let log = worker.log_text();
    assert!(!status.success(), "{log}");
    for expected in [
        "`qty`",
        "schema id",
        "reader schema id",
        "evolution = \"add-columns\"",
    ] {
        assert!(log.contains(expected), "{expected:?} in:\n{log}");
    }
    worker.child = None;
    job.produced = 10;
    job.assert_exactly_once();
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_on_different_schema_versions_write_each_record_once() {
    let mut job = Job::new("evolve_two", 2, 2, "3s").await;
    job.read_registry_avro();
    job.evolve_every_sink();
    job.produce_avro(&order_schema(&[]), 100, |_| json!({}));
    // The first process reads with version 1 and takes both subtasks.
    let mut first = job.spawn_worker(&[]);
    job.wait_spread(2, 1, Duration::from_secs(60));
    job.wait_copied(100, Duration::from_secs(60));

    // Version 2 is registered before any record of it: the second process starts on it (its sinks add `qty` to
    // the tables while the first process goes on writing version-1 rows into them) and takes one subtask.
    let with_qty = order_schema(&[("qty", "long")]);
    job.register_value_schema(&with_qty).await;
    let mut second = job.spawn_worker(&[]);
    job.wait_spread(2, 2, Duration::from_secs(60));

    // Records of version 2 reach both: the first process widens its reader and finds the columns there.
    job.produce_avro(&with_qty, 100, |id| json!({ "qty": id }));
    job.wait_copied(200, Duration::from_secs(90));
    first.stop(Duration::from_secs(60));
    second.stop(Duration::from_secs(60));
    assert!(
        first.log_text().contains("the source's schema changed"),
        "the first process met the change:\n{}",
        first.log_text()
    );
    job.assert_exactly_once();
    let summary = Services::get().psql(&format!(
        "SELECT count(*) FILTER (WHERE id < 100 AND qty IS NULL), count(*) FILTER (WHERE id >= 100 AND qty = id) \
         FROM \"{}\"",
        job.table
    ));
    assert_eq!(summary.trim(), "100|100");
}

/// An `Order` whose `qty`, `ratio`, `price` and `code` are typed as each version of the widening test types them;
/// its `customer` record has `email` from version 3 (decimal(12, 2)) on.
fn typed_order(qty: &str, ratio: &str, precision: u32, code: Value) -> String {
    let mut customer = vec![json!({"name": "name", "type": "string"})];
    if precision == 12 {
        customer.push(json!({"name": "email", "type": ["null", "string"], "default": null}));
    }
    json!({"type": "record", "name": "Order", "namespace": "ratchet.test", "fields": [
        {"name": "id", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": null},
        {"name": "qty", "type": qty},
        {"name": "ratio", "type": ratio},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": 2}},
        {"name": "code", "type": code},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": customer}},
    ]})
    .to_string()
}

/// The values each id of the widening test is produced with (`qty`, `ratio`'s text, `price`, `code`): ids below
/// 100 are version 1 (int, float, decimal(9, 2), required code), 100-199 version 2 (long, double), 200-299
/// version 3 (decimal(12, 2)), 300-399 version 4 (code optional, null for odd ids).
fn typed_values(id: u64) -> (i64, String, String, Option<String>) {
    let cents = format!("{:02}", id % 100);
    let qty = match id < 100 {
        true => id as i64,
        false => id as i64 * 100_000_000_000,
    };
    let ratio = match id < 100 {
        true => format!("{id}.25"),
        false => format!("{id}.1"),
    };
    let price = match id {
        0..100 => format!("1234567.{cents}"),
        100..200 => format!("7654321.{cents}"),
        _ => format!("1234567890.{cents}"),
    };
    let code = (id < 300 || id.is_multiple_of(2)).then(|| format!("c{id}"));
    (qty, ratio, price, code)
}

/// The record fields of id `id` (besides `id` and `note`).
fn typed_record(id: u64) -> Value {
    let (qty, ratio, price, code) = typed_values(id);
    let customer = match id >= 200 {
        true => json!({"name": format!("n{id}"), "email": format!("e{id}")}),
        false => json!({"name": format!("n{id}")}),
    };
    json!({"qty": qty, "ratio": ratio.parse::<f64>().unwrap(), "price": price, "code": code,
        "customer": customer})
}

/// Asserts a reader's `customer` value (a JSON object, `{"json": ..}` from sql_values.py, or JSON text) is id
/// `id`'s: its name, and its email from version 3 on (null or absent before: the nested field did not exist).
fn assert_customer(reader: &str, id: u64, customer: &Value) {
    let customer = match customer {
        Value::Object(o) if o.contains_key("json") => o["json"].clone(),
        Value::String(text) => serde_json::from_str(text).unwrap(),
        other => other.clone(),
    };
    assert_eq!(
        customer["name"],
        json!(format!("n{id}")),
        "{reader} customer of {id}: {customer}"
    );
    let email = (id >= 200).then(|| format!("e{id}"));
    assert_eq!(
        customer["email"].as_str(),
        email.as_deref(),
        "{reader} customer of {id}: {customer}"
    );
}

/// Asserts `rows` (sql_values.py's, or the Iceberg readers' as objects) hold each id's own values, exactly (a
/// float as sql_values.py's `{"float": repr}`, Iceberg Java's text or a JSON number).
fn assert_typed_rows(reader: &str, rows: &[Value]) {
    assert_eq!(rows.len(), 400, "{reader}");
    for row in rows {
        let id = row["id"].as_u64().unwrap();
        let (qty, ratio, price, code) = typed_values(id);
        let read_ratio = match &row["ratio"] {
            Value::Object(float) => float["float"].as_str().and_then(|f| f.parse::<f64>().ok()),
            Value::String(text) => text.parse::<f64>().ok(),
            other => other.as_f64(),
        };
        let read_ratio = read_ratio.unwrap_or_else(|| panic!("{reader} ratio of {row}"));
        assert_eq!(row["qty"].as_i64(), Some(qty), "{reader} qty of {row}");
        assert_eq!(
            read_ratio,
            ratio.parse::<f64>().unwrap(),
            "{reader} ratio of {row}"
        );
        assert_eq!(
            row["price"].as_str(),
            Some(price.as_str()),
            "{reader} price of {row}"
        );
        assert_eq!(
            row["code"].as_str(),
            code.as_deref(),
            "{reader} code of {row}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn widened_and_optional_fields_change_every_sink_exactly_once_across_kills() {
    let mut job = Job::with_sections("widen", 2, 2, "3s", |name| {
        format!(
            "\n[[sinks]]\ntype = \"jdbc\"\nid = \"mariadb\"\nurl = \"{}\"\ntable = \"{name}\"\ncreate_table = true\n",
            Services::get().mysql_url()
        )
    })
    .await;
    job.store_locally();
    job.read_registry_avro();
    job.set_every_sink_evolution("evolve");
    let code = json!("string");
    let optional_code = json!(["null", "string"]);
    job.produce_avro(
        &typed_order("int", "float", 9, code.clone()),
        100,
        typed_record,
    );

    // int to long and float to double: killed before any sink evolved; the restart opens every sink on version 2,
    // and each widens its columns as it opens.
    let v2 = typed_order("long", "double", 9, code.clone());
    killed_at_the_change(&mut job, "before-evolve", &v2, 100, typed_record).await;
    // decimal(9, 2) to decimal(12, 2) and `customer.email` added inside a nested record: killed after the first sink
    // evolved.
    let v3 = typed_order("long", "double", 12, code);
    killed_at_the_change(&mut job, "after-evolve", &v3, 100, typed_record).await;

    // check-config sees the tables still on decimal(9, 2): with evolve it names what the next run widens, with
    // add-columns it refuses the column.
    let check = job.ratchet("check-config");
    let out = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{out}");
    assert!(
        out.contains("widens (or makes nullable) column(s) price"),
        "{out}"
    );
    assert!(
        out.contains("widens (or makes optional) column(s) price"),
        "{out}"
    );
    let evolving = std::fs::read_to_string(&job.config).unwrap();
    std::fs::write(
        &job.config,
        evolving.replace("\"evolve\"", "\"add-columns\""),
    )
    .unwrap();
    let check = job.ratchet("check-config");
    let out = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(!check.status.success(), "{out}");
    assert!(out.contains("price"), "{out}");
    std::fs::write(&job.config, evolving).unwrap();

    // A required field made optional while the last process runs: every sink takes it between checkpoints.
    let mut worker = job.spawn_worker(&["--exit-when-idle", "5s"]);
    job.wait_copied(job.produced as usize, Duration::from_secs(60));
    job.produce_avro(
        &typed_order("long", "double", 12, optional_code),
        100,
        typed_record,
    );
    worker.wait_exit(Duration::from_secs(120));
    assert!(
        worker.log_text().contains("sink took the new schema"),
        "{}",
        worker.log_text()
    );
    job.assert_exactly_once();

    let services = Services::get();
    let pg = services.verify(
        "sql_values.py",
        &["pg", services.pg_url(), &job.table, "id"],
    );
    assert_typed_rows("PostgreSQL", pg["rows"].as_array().unwrap());
    let types = &pg["types"];
    assert_eq!(
        [&types["qty"], &types["ratio"], &types["price"]],
        [
            &json!("bigint"),
            &json!("double precision"),
            &json!("numeric(12,2)")
        ],
        "{types}"
    );
    let maria = services.verify(
        "sql_values.py",
        &["mysql", services.mysql_url(), &job.table, "id"],
    );
    assert_typed_rows("MariaDB", maria["rows"].as_array().unwrap());
    let types = &maria["types"];
    assert_eq!(
        [&types["qty"], &types["price"]],
        [&json!("bigint(20)"), &json!("decimal(12,2)")],
        "{types}"
    );

    // pyiceberg and Iceberg's Java library read the older files' narrower values promoted, and the nulls.
    let lake = job.read_lake(&["--rows", "--java-rows"]);
    for (reader, names, rows) in [
        ("pyiceberg", "column_names", "rows"),
        ("iceberg-java", "java_column_names", "java_rows"),
    ] {
        let names: Vec<&str> = lake[names]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        let rows: Vec<Value> = lake[rows]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                let mut object: serde_json::Map<String, Value> = names
                    .iter()
                    .zip(row.as_array().unwrap())
                    .map(|(n, v)| (n.to_string(), v.clone()))
                    .collect();
                // Decimals as text, in both readers' renderings.
                if let Some(price) = object.get("price").cloned() {
                    let text = price
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or(price.to_string());
                    object.insert("price".into(), Value::from(text));
                }
                Value::Object(object)
            })
            .collect();
        assert_typed_rows(reader, &rows);
    }

    // The Kafka copy's JSON has each record's values as its schema version wrote them.
    for value in job.copy_values() {
        let id = value["id"].as_u64().unwrap();
        let (qty, ratio, _, code) = typed_values(id);
        assert_eq!(value["qty"].as_i64(), Some(qty), "{value}");
        assert_eq!(
            value["ratio"].as_f64(),
            Some(ratio.parse::<f64>().unwrap()),
            "{value}"
        );
        assert_eq!(value["code"].as_str(), code.as_deref(), "{value}");
        assert_customer("Kafka", id, &value["customer"]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ignoring_table_sinks_keep_their_columns_exactly_once_across_kills() {
    let mut job = Job::with_sections("ignore", 2, 2, "3s", |name| {
        format!(
            "\n[[sinks]]\ntype = \"jdbc\"\nid = \"mariadb\"\nurl = \"{}\"\ntable = \"{name}\"\ncreate_table = true\n",
            Services::get().mysql_url()
        )
    })
    .await;
    job.store_locally();
    job.read_registry_avro();
    // The file and Kafka sinks take the new fields; the three tables ignore them.
    job.evolve_every_sink();
    job.ignore_in_tables();
    job.produce_avro(&order_schema(&[]), 100, |_| json!({}));

    let with_qty = order_schema(&[("qty", "long")]);
    killed_at_the_change(
        &mut job,
        "before-evolve",
        &with_qty,
        100,
        |id| json!({ "qty": id }),
    )
    .await;
    let with_tag = order_schema(&[("qty", "long"), ("tag", "string")]);
    killed_at_the_change(
        &mut job,
        "after-evolve",
        &with_tag,
        100,
        |id| json!({ "qty": id, "tag": format!("t{id}") }),
    )
    .await;

    // check-config names what each table sink leaves out; a file sink cannot ignore (it has no table).
    let check = job.ratchet("check-config");
    let out = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{out}");
    assert_eq!(
        out.matches("leaves out column(s) qty, tag (evolution = \"ignore\"")
            .count(),
        3,
        "{out}"
    );
    let evolving = std::fs::read_to_string(&job.config).unwrap();
    std::fs::write(
        &job.config,
        evolving.replacen(
            "evolution = \"add-columns\"\ntype = \"file\"",
            "evolution = \"ignore\"\ntype = \"file\"",
            1,
        ),
    )
    .unwrap();
    let check = job.ratchet("check-config");
    let out = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(!check.status.success(), "{out}");
    assert!(out.contains("a file sink has no table"), "{out}");
    std::fs::write(&job.config, evolving).unwrap();

    // The last process opens on the latest schema (the tables lack qty and tag: left out from the start) and meets
    // one more change while it runs.
    let port = free_port();
    let mut worker = job.spawn_worker(&["--metrics-listen", &format!("127.0.0.1:{port}")]);
    job.wait_copied(job.produced as usize, Duration::from_secs(60));
    let with_price = order_schema(&[("qty", "long"), ("tag", "string"), ("price", "double")]);
    job.produce_avro(
        &with_price,
        100,
        |id| json!({ "qty": id, "tag": format!("t{id}"), "price": id as f64 / 2.0 }),
    );
    job.wait_copied(job.produced as usize, Duration::from_secs(90));
    // Values left out in this process: qty and tag of the 100 records replayed after the last kill, and qty, tag
    // and price of the last 100, in each of the three table sinks.
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let body = scrape(port).unwrap_or_default();
        if total(&body, "ratchet_ignored_values_total") >= 1500.0 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the left-out values were not counted:\n{body}\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(body.contains("column=\"price\""), "{body}");
    worker.stop(Duration::from_secs(60));
    let log = worker.log_text();
    assert!(
        log.contains("the batches' new columns are left out"),
        "{log}"
    );
    job.assert_exactly_once();

    // Every table still has only its first columns, each row with its own values.
    let services = Services::get();
    for (kind, url) in [("pg", services.pg_url()), ("mysql", services.mysql_url())] {
        let table = services.verify("sql_values.py", &[kind, url, &job.table, "id"]);
        assert_eq!(table["columns"], json!(["id", "note"]), "{kind}: {table}");
        let rows = table["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 400, "{kind}");
        for row in rows {
            let id = row["id"].as_i64().unwrap();
            assert_eq!(row["note"], json!(format!("n{id}")), "{kind}: {row}");
        }
    }
    let lake = job.read_lake(&["--columns"]);
    let columns: Vec<&String> = lake["columns"].as_object().unwrap().keys().collect();
    assert_eq!(columns, ["id", "note"], "{lake}");
    assert_eq!(
        lake["columns"]["note"],
        Value::from((0..400).collect::<Vec<i64>>())
    );
    // The Kafka copy took the new fields.
    for value in job.copy_values() {
        let id = value["id"].as_i64().unwrap();
        let qty = (id >= 100).then_some(id);
        assert_eq!(value["qty"].as_i64(), qty, "{value}");
    }
}

/// The order schema with `qty` named `name` (its earlier names in `aliases`), and a nested `customer` record
/// whose one field is named `contact` (its earlier names in `contact_aliases`).
fn renamed_order(name: &str, aliases: &[&str], contact: &str, contact_aliases: &[&str]) -> String {
    let mut schema: Value = serde_json::from_str(&order_schema(&[(name, "long")])).unwrap();
    schema["fields"][2]["aliases"] = json!(aliases);
    let customer = json!({"type": "record", "name": "Customer", "fields": [
        {"name": contact, "aliases": contact_aliases, "type": ["null", "string"], "default": null}]});
    schema["fields"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "customer", "type": ["null", customer], "default": null}));
    schema.to_string()
}

/// Asserts the PostgreSQL table (psql) and the Iceberg table (pyiceberg) hold ids `0..count` under version 1's
/// names: `qty` equal to the id, and the struct column `customer` keying its field `mail`.
fn assert_tables_keep_version_1_names(job: &Job, count: i64) {
    let services = Services::get();
    let table = services.verify(
        "sql_values.py",
        &["pg", services.pg_url(), &job.table, "id"],
    );
    assert_eq!(
        table["columns"],
        json!(["id", "note", "qty", "customer"]),
        "{table}"
    );
    let rows = table["rows"].as_array().unwrap();
    assert_eq!(rows.len() as i64, count, "{table}");
    for row in rows {
        assert_eq!(row["qty"], row["id"], "{row}");
        // The struct column (jsonb, which the verifier shows as {"json": value}) keys its field by the name of
        // version 1.
        assert_eq!(
            row["customer"],
            json!({ "json": { "mail": format!("m{}", row["id"]) } }),
            "{row}"
        );
    }
    let lake = job.read_lake(&["--columns"]);
    let columns: Vec<&String> = lake["columns"].as_object().unwrap().keys().collect();
    assert_eq!(columns, ["customer", "id", "note", "qty"], "{lake}");
    assert_eq!(
        lake["columns"]["qty"],
        Value::from((0..count).collect::<Vec<i64>>())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_field_renamed_by_aliases_keeps_its_column_across_restarts_and_kills() {
    let mut job = Job::new("rename", 2, 2, "3s").await;
    job.store_locally();
    job.read_registry_avro();
    // With add-columns, a rename taken for a new field would add a column: it must not.
    job.evolve_every_sink();
    job.produce_avro(
        &renamed_order("qty", &[], "mail", &[]),
        100,
        |id| json!({ "qty": id, "customer": { "mail": format!("m{id}") } }),
    );
    let mut worker = job.spawn_worker(&[]);
    job.wait_copied(100, Duration::from_secs(60));
    // Renamed while the job runs: the running reader (version 1) reads `quantity` into `qty`, and the nested
    // `email` into `customer.mail`.
    job.produce_avro(
        &renamed_order("quantity", &["qty"], "email", &["mail"]),
        100,
        |id| json!({ "quantity": id, "customer": { "email": format!("m{id}") } }),
    );
    job.wait_copied(150, Duration::from_secs(60));
    worker.kill9();
    // Renamed again before the restart, which reads with version 3 (`amount`, aliases `quantity`) and replays
    // what the kill left uncommitted: the column keeps the name of version 1.
    job.produce_avro(
        &renamed_order("amount", &["quantity"], "contact", &["email"]),
        100,
        |id| json!({ "amount": id, "customer": { "contact": format!("m{id}") } }),
    );
    let mut worker = job.spawn_worker(&["--exit-when-idle", "5s"]);
    worker.wait_exit(Duration::from_secs(120));
    assert!(
        !worker.log_text().contains("the source's schema changed"),
        "{}",
        worker.log_text()
    );
    job.assert_exactly_once();

    assert_tables_keep_version_1_names(&job, 300);
    for value in job.copy_values() {
        assert_eq!(value["qty"], value["id"], "{value}");
        assert!(
            value.get("quantity").is_none() && value.get("amount").is_none(),
            "{value}"
        );
        // The nested field keeps the name of version 1 in the JSON copy too.
        let customer = value["customer"].to_string();
        assert!(
            customer.contains(&format!("\"mail\":\"m{}\"", value["id"]))
                && !customer.contains("email")
                && !customer.contains("contact"),
            "{value}"
        );
    }
}

/// Two processes on either side of a change that renames a field (top-level and nested, by Avro aliases) and adds
/// one: the first reads with version 1; the second starts once version 2 is registered (before any record of it)
/// and takes a subtask. Both read version 2's records into the renamed fields' columns (`qty`, `customer.mail`):
/// the renames are found from the registry by each process alone, and they agree. The PostgreSQL and Iceberg
/// tables (`ignore`) leave the added field out in both; the Kafka copy (`add-columns`) takes it. Every record once.
#[tokio::test(flavor = "multi_thread")]
async fn two_processes_on_either_side_of_a_rename_and_an_ignored_field_write_each_record_once() {
    let mut job = Job::new("rename_two", 2, 2, "3s").await;
    job.read_registry_avro();
    job.evolve_every_sink();
    job.ignore_in_tables();
    job.produce_avro(
        &renamed_order("qty", &[], "mail", &[]),
        100,
        |id| json!({ "qty": id, "customer": { "mail": format!("m{id}") } }),
    );
    let mut first = job.spawn_worker(&[]);
    job.wait_spread(2, 1, Duration::from_secs(60));
    job.wait_copied(100, Duration::from_secs(60));

    let mut renamed: Value =
        serde_json::from_str(&renamed_order("quantity", &["qty"], "email", &["mail"])).unwrap();
    renamed["fields"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "tag", "type": ["null", "string"], "default": null}));
    let renamed = renamed.to_string();
    job.register_value_schema(&renamed).await;
    let mut second = job.spawn_worker(&[]);
    job.wait_spread(2, 2, Duration::from_secs(60));
    job.produce_avro(&renamed, 100, |id| {
        json!({ "quantity": id, "customer": { "email": format!("m{id}") }, "tag": format!("t{id}") })
    });
    job.wait_copied(200, Duration::from_secs(90));
    first.stop(Duration::from_secs(60));
    second.stop(Duration::from_secs(60));
    job.assert_exactly_once();

    assert_tables_keep_version_1_names(&job, 200);
    for value in job.copy_values() {
        let id = value["id"].as_u64().unwrap();
        assert_eq!(value["qty"], value["id"], "{value}");
        let tag = (id >= 100).then(|| format!("t{id}"));
        assert_eq!(value["tag"].as_str(), tag.as_deref(), "{value}");
        assert!(
            value.get("quantity").is_none()
                && value["customer"]
                    .to_string()
                    .contains(&format!("\"mail\":\"m{id}\"")),
            "{value}"
        );
    }
}
