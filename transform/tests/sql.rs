//! Transforms over real batches: what each kind of SQL produces, what is refused and why, and rows that fail.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int64Type};
use arrow_array::{Array, ArrayRef, Int64Array, ListArray, RecordBatch, StringArray, StructArray};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use connector_api::ErrorKind;
use transform::{Pipeline, Transform};

fn orders() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("email", DataType::Utf8, true),
        Field::new("price", DataType::Utf8, true),
        Field::new("payload", DataType::Utf8, true),
        Field::new("__op", DataType::Utf8, false).with_metadata(HashMap::from([(
            "ratchet.change".to_string(),
            "op".to_string(),
        )])),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
            Arc::new(StringArray::from(vec![
                Some("a@example.com"),
                None,
                Some("c@example.com"),
                Some("d@example.com"),
            ])),
            Arc::new(StringArray::from(vec!["1.50", "oops", "3", "123456789.99"])),
            Arc::new(StringArray::from(vec![
                r#"{"customer": {"name": "Ann"}, "tags": ["x"]}"#,
                r#"{"customer": {"name": "Bob"}}"#,
                r#"[1, 2]"#,
                r#"{"customer": {"name": "Dee"}}"#,
            ])),
            Arc::new(StringArray::from(vec!["c", "u", "u", "d"])),
        ],
    )
    .unwrap()
}

fn plan(sql: &str, input: &SchemaRef) -> Transform {
    Transform::sql("t", sql, input.clone()).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn refused(sql: &str) -> String {
    let err = Transform::sql("shape", sql, orders().schema()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let text = err.to_string();
    assert!(text.contains("transform \"shape\""), "{text}");
    text
}

#[test]
fn projection_rename_hash_filter_and_json() {
    let batch = orders();
    let t = plan(
        "SELECT id AS order_id, encode(sha256(email), 'hex') AS email_hash, \
         json_get_str(payload, 'customer', 'name') AS customer, upper(__op) AS op \
         FROM input WHERE id <> 3",
        &batch.schema(),
    );
    let out = t.apply(&batch).unwrap();
    assert_eq!(out.num_rows(), 3);
    let names: Vec<_> = out
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["order_id", "email_hash", "customer", "op"]);
    let ids = out.column(0).as_primitive::<Int64Type>();
    assert_eq!(ids.values(), &[1, 2, 4]);
    let hashes = out.column(1).as_string::<i32>();
    // sha256("a@example.com"), computed independently with coreutils' sha256sum.
    assert_eq!(
        hashes.value(0),
        "08168cd80dfd534ab0f10af10f1303fe00af2d43ab5c1432360d137f8197e17a"
    );
    assert!(hashes.is_null(1), "the hash of null is null");
    let customers = out.column(2).as_string::<i32>();
    assert_eq!(customers.value(0), "Ann");
    assert_eq!(customers.value(2), "Dee");
    assert_eq!(t.origin_of("order_id"), Some("id"));
    assert_eq!(t.origin_of("email_hash"), None);
    assert_eq!(t.origin_of("op"), None);
}

#[test]
fn change_columns_keep_their_marks_through_a_projection() {
    let batch = orders();
    let t = plan("SELECT id, __op FROM input", &batch.schema());
    let out = t.apply(&batch).unwrap();
    assert_eq!(
        out.schema()
            .field(1)
            .metadata()
            .get("ratchet.change")
            .map(String::as_str),
        Some("op"),
        "{:?}",
        out.schema()
    );
    assert!(
        connector_api::ChangeColumns::of(&out.schema())
            .unwrap()
            .is_some()
    );
}

#[test]
fn a_failing_cast_is_isolated_to_its_row_and_named() {
    let batch = orders();
    let t = Arc::new(plan(
        "SELECT id, CAST(price AS DECIMAL(10, 2)) AS price FROM input",
        &batch.schema(),
    ));
    let failure = t.apply(&batch).unwrap_err();
    assert!(failure.expression.contains("CAST"), "{failure}");
    assert!(failure.expression.contains("price"), "{failure}");
    let pipeline = Pipeline::new(batch.schema(), vec![t]).unwrap();
    let isolated = pipeline.apply_isolating(&batch);
    let rows: Vec<usize> = isolated.failures.iter().map(|f| f.row).collect();
    // "oops" is not a number; 123456789.99 has 9 digits before the point, DECIMAL(10, 2) holds 8.
    assert_eq!(rows, [1, 3], "{:?}", isolated.failures);
    assert_eq!(isolated.rows.num_rows(), 2);
    let prices = isolated.rows.column(1).as_primitive::<Decimal128Type>();
    assert_eq!(prices.value(0), 150);
    assert_eq!(prices.value(1), 300);
    assert_eq!(
        isolated.rows.column(0).as_primitive::<Int64Type>().values(),
        &[1, 3]
    );
}

#[test]
fn nested_fields_structs_and_unnest() {
    let item = Fields::from(vec![
        Field::new("sku", DataType::Utf8, true),
        Field::new("qty", DataType::Int64, true),
    ]);
    let customer = Fields::from(vec![Field::new("name", DataType::Utf8, true)]);
    let items = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
        Some(vec![Some(1), Some(2)]),
        Some(vec![]),
        Some(vec![Some(7)]),
    ]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("customer", DataType::Struct(customer.clone()), true),
        Field::new("lines", items.data_type().clone(), true),
        Field::new("first", DataType::Struct(item.clone()), true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![10, 11, 12])),
            Arc::new(StructArray::new(
                customer,
                vec![Arc::new(StringArray::from(vec!["Ann", "Bob", "Cy"])) as ArrayRef],
                None,
            )),
            Arc::new(items),
            Arc::new(StructArray::new(
                item,
                vec![
                    Arc::new(StringArray::from(vec!["s1", "s2", "s3"])) as ArrayRef,
                    Arc::new(Int64Array::from(vec![1, 2, 3])),
                ],
                None,
            )),
        ],
    )
    .unwrap();
    let flat = plan(
        "SELECT id, customer['name'] AS customer_name, first.sku AS sku, \
         named_struct('n', id * 2) AS doubled FROM input",
        &schema,
    );
    let out = flat.apply(&batch).unwrap();
    assert_eq!(out.column(1).as_string::<i32>().value(1), "Bob");
    assert_eq!(out.column(2).as_string::<i32>().value(2), "s3");
    assert!(matches!(
        out.schema().field(3).data_type(),
        DataType::Struct(_)
    ));

    let lines = plan("SELECT id, unnest(lines) AS line FROM input", &schema);
    let out = lines.apply(&batch).unwrap();
    assert_eq!(
        out.column(0).as_primitive::<Int64Type>().values(),
        &[10, 10, 12]
    );
    assert_eq!(
        out.column(1).as_primitive::<Int64Type>().values(),
        &[1, 2, 7]
    );
    assert_eq!(lines.origin_of("id"), Some("id"));
    assert_eq!(lines.origin_of("line"), None);
}

#[test]
fn non_deterministic_functions_are_refused_naming_them() {
    for (sql, named) in [
        ("SELECT id, now() AS at FROM input", "now()"),
        ("SELECT id, random() AS r FROM input", "random()"),
        ("SELECT id, uuid() AS u FROM input", "uuid()"),
        ("SELECT id FROM input WHERE id > random()", "random()"),
        ("SELECT id, current_date AS d FROM input", "current_date"),
    ] {
        let text = refused(sql);
        assert!(
            text.contains(named) && text.contains("not deterministic"),
            "{sql}: {text}"
        );
    }
}

#[test]
fn stateful_and_non_query_sql_is_refused() {
    for (sql, says) in [
        (
            "SELECT __op, count(*) FROM input GROUP BY __op",
            "aggregate",
        ),
        ("SELECT sum(id) FROM input", "aggregate"),
        (
            "SELECT id, row_number() OVER (ORDER BY id) FROM input",
            "window",
        ),
        (
            "SELECT a.id FROM input a JOIN input b ON a.id = b.id",
            "join",
        ),
        ("SELECT id FROM input ORDER BY id", "ORDER BY"),
        ("SELECT id FROM input LIMIT 3", "LIMIT"),
        ("SELECT DISTINCT __op FROM input", "DISTINCT"),
        (
            "SELECT id FROM input WHERE id IN (SELECT id FROM input)",
            "subquery",
        ),
        ("CREATE TABLE x (a INT)", "not a query"),
        ("SELECT * FROM other", "other"),
        ("SELECT nope FROM input", "nope"),
    ] {
        let text = refused(sql);
        assert!(text.contains(says), "{sql}: {text}");
        assert!(text.contains("SQL:"), "{text}");
    }
}

#[test]
fn select_star_follows_the_schema_an_explicit_projection_does_not() {
    let batch = orders();
    let star = plan("SELECT * FROM input WHERE id > 0", &batch.schema());
    let listed = plan("SELECT id, email FROM input", &batch.schema());
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("region", DataType::Utf8, true));
    let grown = Arc::new(Schema::new(fields.clone()));
    assert_eq!(
        star.replanned(grown.clone())
            .unwrap()
            .output_schema()
            .fields()
            .len(),
        6
    );
    assert_eq!(
        listed
            .replanned(grown)
            .unwrap()
            .output_schema()
            .fields()
            .len(),
        2
    );

    let without_email = Arc::new(Schema::new(
        fields
            .into_iter()
            .filter(|f| f.name() != "email")
            .collect::<Vec<_>>(),
    ));
    let err = listed.replanned(without_email).unwrap_err();
    assert!(err.to_string().contains("email"), "{err}");
}

#[test]
fn a_pipeline_chains_and_traces_origins() {
    let batch = orders();
    let first = Arc::new(plan(
        "SELECT id AS key, email FROM input WHERE __op <> 'd'",
        &batch.schema(),
    ));
    let second = Arc::new(plan(
        "SELECT key, lower(email) AS email FROM input",
        first.output_schema(),
    ));
    let pipeline = Pipeline::new(batch.schema(), vec![first, second]).unwrap();
    assert_eq!(pipeline.origin_of("key"), Some("id"));
    assert_eq!(pipeline.origin_of("email"), None);
    let out = pipeline.apply(&batch).unwrap();
    assert_eq!(out.num_rows(), 3);
    assert_eq!(pipeline.output_schema().fields().len(), 2);
}

#[test]
fn casts_to_zoned_timestamps_and_json_operators() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("at", DataType::Utf8, false),
        Field::new("doc", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(vec!["2026-12-05T10:00:00Z"])),
            Arc::new(StringArray::from(vec![r#"{"a": {"b": "x"}, "n": 7}"#])),
        ],
    )
    .unwrap();
    let t = plan(
        "SELECT arrow_cast(CAST(at AS TIMESTAMP), 'Timestamp(Microsecond, Some(\"UTC\"))') AS at_utc, \
         doc->'a'->>'b' AS b, json_get_int(doc, 'n') AS n FROM input",
        &schema,
    );
    let out = t.apply(&batch).unwrap();
    assert_eq!(
        out.schema().field(0).data_type(),
        &DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, Some("UTC".into()))
    );
    assert_eq!(
        out.column(0)
            .as_primitive::<arrow_array::types::TimestampMicrosecondType>()
            .value(0),
        1_796_464_800_000_000
    );
    assert_eq!(out.column(1).as_string::<i32>().value(0), "x");
    assert_eq!(out.column(2).as_primitive::<Int64Type>().value(0), 7);
}
