//! The table a sink writes to, at its start: looked up, and created when missing and `create_table` is set
//! (with its namespace), each catalog call bounded by `commit_timeout` and its failure classified by
//! [`setup_kind`]: a refusal the catalog will repeat is a configuration error, anything else retryable.

use std::collections::HashMap;
use std::time::Duration;

use connector_api::{Error, Phase, Result, RetryPolicy, SinkId};
use iceberg::spec::{PrimitiveType, Type};
use iceberg::{Catalog, NamespaceIdent, TableCreation, TableIdent};

use crate::config::IcebergSinkConfig;
use crate::error::{iceberg_error, setup_kind, within};
use crate::layout::BoundLayout;
use crate::manifest_merge::MANIFEST_MERGE_ENABLED;
use crate::retire::DELETE_METADATA_AFTER_COMMIT;
use crate::types;
use crate::upsert::table_schema;

/// Makes sure table `ident` exists in `catalog`: looks it up and, when it is missing, creates it (with its
/// namespace) as [`created_table`] says if `config.create_table`. Each catalog call is bounded by
/// `config.commit_timeout`.
///
/// # Errors
/// [`Config`](connector_api::ErrorKind::Config) for a missing table without `create_table`, a schema or layout the table cannot
/// have, or a request the catalog refuses ([`setup_kind`]); [`Retryable`](connector_api::ErrorKind::Retryable) for a catalog
/// that does not answer within `commit_timeout` or fails in a way that may pass.
pub(crate) async fn ensure_table(
    catalog: &dyn Catalog,
    ident: &TableIdent,
    config: &IcebergSinkConfig,
) -> Result<()> {
    let limit = config.commit_timeout;
    let exists = within(
        limit,
        &format!("a lookup of table {ident}"),
        table_exists(catalog, ident),
    )
    .await
    .map_err(|e| e.with_sink(&config.sink))?;
    if exists {
        return Ok(());
    }
    if !config.create_table {
        return Err(Error::config(format!(
            "table {ident} does not exist in the catalog: create it, or set create_table = true to create it \
             from the input schema"
        ))
        .with_sink(&config.sink));
    }
    let (schema, layout) = created_table(config)?;
    create_table(catalog, ident, (schema, layout), &config.job, limit)
        .await
        .map_err(|e| e.with_sink(&config.sink))
}

/// Whether `ident` exists, its failure classified by [`setup_kind`].
async fn table_exists(catalog: &dyn Catalog, ident: &TableIdent) -> Result<bool> {
    catalog
        .table_exists(ident)
        .await
        .map_err(|e| setup_error(format!("cannot look up table {ident}"), e))
}

/// A catalog's failure at start-up as [`setup_kind`] classifies it.
fn setup_error(message: String, e: iceberg::Error) -> Error {
    Error::new(setup_kind(&e), Phase::Setup, message).with_source(e)
}

/// The schema and layout a table `config`'s sink creates is created with: the batches' columns
/// ([`types::table_schema`]), the upsert key as its identifier fields when every key column is a required
/// primitive other than a float or double (what Iceberg allows as identifier fields), and the job file's partition
/// spec, sort order and properties.
///
/// # Errors
/// [`Config`](connector_api::ErrorKind::Config) for a column without an exact Iceberg type, or a layout that does not fit the
/// columns (naming the term).
pub(crate) fn created_table(
    config: &IcebergSinkConfig,
) -> Result<(iceberg::spec::Schema, BoundLayout)> {
    let schema = types::table_schema(table_schema(config)?.as_ref())
        .map_err(|refusals| types::refused(&config.sink, &config.table, &refusals))?;
    let key: Option<Vec<i32>> = config
        .upsert_key
        .iter()
        .map(|name| {
            schema
                .field_by_name(name)
                .filter(|f| {
                    f.required
                        && matches!(&*f.field_type, Type::Primitive(p)
                            if !matches!(p, PrimitiveType::Float | PrimitiveType::Double))
                })
                .map(|f| f.id)
        })
        .collect();
    let schema = match key.filter(|ids| !ids.is_empty()) {
        Some(ids) => schema
            .into_builder()
            .with_identifier_field_ids(ids)
            .build()
            .map_err(|e| {
                iceberg_error(Phase::Setup, "cannot set the key as identifier fields", e)
            })?,
        None => schema,
    };
    let layout = config.layout.bind(&config.sink, &schema)?;
    Ok((schema, layout))
}

/// How often creating the namespace is tried while the catalog's failures are retryable: one that lasts (a catalog
/// that is down) is reported after 6 attempts and about 10 s of back-off.
const NAMESPACE_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 6,
    initial_backoff: Duration::from_millis(100),
    max_backoff: Duration::from_secs(2),
    max_total_backoff: Duration::from_secs(10),
};

/// Creates `namespace` unless it exists, each catalog call within `limit`. Another subtask may create it at the
/// same moment: a failed creation is fine if the namespace exists afterwards. A catalog may also answer a look-up
/// with an error while another creation is half done (SeaweedFS's catalog answers HTTP 500 "attribute not found:
/// s3tables.metadata" until the other creation finishes): such a failure is retryable ([`setup_kind`]), and the
/// caller retries the whole call, bounded; a refusal (HTTP 403, a bad name) is a configuration error at once.
async fn ensure_namespace(
    catalog: &dyn Catalog,
    namespace: &NamespaceIdent,
    limit: Duration,
) -> Result<()> {
    let exists = || async {
        within(
            limit,
            &format!("a lookup of namespace {namespace:?}"),
            async {
                catalog.namespace_exists(namespace).await.map_err(|e| {
                    setup_error(format!("cannot look up the namespace {namespace:?}"), e)
                })
            },
        )
        .await
    };
    if exists().await? {
        return Ok(());
    }
    let created = within(
        limit,
        &format!("the creation of namespace {namespace:?}"),
        async {
            catalog
                .create_namespace(namespace, HashMap::new())
                .await
                .map_err(|e| setup_error(format!("cannot create the namespace {namespace:?}"), e))
        },
    )
    .await;
    match created {
        Ok(_) => Ok(()),
        Err(e) => match exists().await {
            Ok(true) => Ok(()),
            _ => Err(e),
        },
    }
}

/// Creates the namespace (if missing) and a table of `iceberg_schema` laid out as `layout` says, marked as created
/// by `job` ([`crate::CREATED_BY_PROPERTY`]: it compacts by default).
async fn create_table(
    catalog: &dyn Catalog,
    ident: &TableIdent,
    (iceberg_schema, layout): (iceberg::spec::Schema, BoundLayout),
    job: &SinkId,
    limit: Duration,
) -> Result<()> {
    let namespace: &NamespaceIdent = ident.namespace();
    NAMESPACE_RETRY
        .run_idempotent("creating the namespace", || {
            ensure_namespace(catalog, namespace, limit)
        })
        .await?;
    // A streaming writer commits often: keep only the last 100 metadata versions on storage, and merge manifests
    // once 100 pile up (Iceberg's standard properties, which `TableTarget` honours on every commit; iceberg-rust
    // itself does neither).
    // The job file's properties are set over these.
    let mut properties = HashMap::from([
        (DELETE_METADATA_AFTER_COMMIT.to_string(), "true".to_string()),
        (MANIFEST_MERGE_ENABLED.to_string(), "true".to_string()),
        (crate::CREATED_BY_PROPERTY.to_string(), job.to_string()),
    ]);
    properties.extend(layout.properties);
    let creation = TableCreation::builder()
        .name(ident.name().to_string())
        .schema(iceberg_schema)
        .partition_spec(layout.partition_spec)
        .sort_order(layout.sort_order)
        .properties(properties)
        .format_version(layout.format_version)
        .build();
    let created = within(limit, &format!("the creation of table {ident}"), async {
        catalog
            .create_table(namespace, creation)
            .await
            .map_err(|e| setup_error(format!("cannot create table {ident}"), e))
    })
    .await;
    match created {
        Ok(_) => Ok(()),
        // Another subtask may have created it at the same moment.
        Err(e) => match within(
            limit,
            &format!("a lookup of table {ident}"),
            table_exists(catalog, ident),
        )
        .await
        {
            Ok(true) => Ok(()),
            _ => Err(e),
        },
    }
}
