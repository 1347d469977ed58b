//! Which Iceberg catalog the sink commits to.

use std::collections::HashMap;
use std::sync::Arc;

use connector_api::{Phase, Result};
use iceberg::io::LocalFsStorageFactory;
use iceberg::{Catalog, CatalogBuilder};
use iceberg_catalog_rest::RestCatalogBuilder;
use iceberg_catalog_sql::{
    SQL_CATALOG_PROP_BIND_STYLE, SQL_CATALOG_PROP_URI, SQL_CATALOG_PROP_WAREHOUSE,
    SqlCatalogBuilder,
};
use serde::Deserialize;

use crate::error::iceberg_error;

/// An Iceberg catalog.
///
/// | kind | keys |
/// |---|---|
/// | `sql` | `uri` (`sqlite:///path/catalog.db?mode=rwc` or `postgres://...`), `warehouse` (a `file://` path) |
/// | `rest` | `uri` (`http://host:port`), `warehouse`, `props` (passed to the REST client) |
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum CatalogConfig {
    /// iceberg-rust's SQL catalog (the same tables pyiceberg's SqlCatalog reads).
    Sql {
        /// Database URI.
        uri: String,
        /// Warehouse location for new tables.
        warehouse: String,
    },
    /// An Iceberg REST catalog.
    Rest {
        /// Catalog endpoint.
        uri: String,
        /// Warehouse name or location.
        warehouse: String,
        /// Extra client properties.
        #[serde(default)]
        props: HashMap<String, String>,
    },
}

impl CatalogConfig {
    /// Connects to the catalog.
    pub async fn open(&self, name: &str) -> Result<Arc<dyn Catalog>> {
        let catalog: Arc<dyn Catalog> = match self {
            CatalogConfig::Sql { uri, warehouse } => {
                let bind_style = if uri.starts_with("sqlite:") {
                    "QMark"
                } else {
                    "DollarNumeric"
                };
                let props = HashMap::from([
                    (SQL_CATALOG_PROP_URI.to_string(), uri.clone()),
                    (SQL_CATALOG_PROP_WAREHOUSE.to_string(), warehouse.clone()),
                    (
                        SQL_CATALOG_PROP_BIND_STYLE.to_string(),
                        bind_style.to_string(),
                    ),
                ]);
                Arc::new(
                    SqlCatalogBuilder::default()
                        .with_storage_factory(Arc::new(LocalFsStorageFactory))
                        .load(name, props)
                        .await
                        .map_err(|e| {
                            iceberg_error(Phase::Setup, format!("cannot open SQL catalog {uri}"), e)
                        })?,
                )
            }
            CatalogConfig::Rest {
                uri,
                warehouse,
                props,
            } => {
                let mut props = props.clone();
                props.insert("uri".into(), uri.clone());
                props.insert("warehouse".into(), warehouse.clone());
                Arc::new(
                    RestCatalogBuilder::default()
                        .load(name, props)
                        .await
                        .map_err(|e| {
                            iceberg_error(
                                Phase::Setup,
                                format!("cannot open REST catalog {uri}"),
                                e,
                            )
                        })?,
                )
            }
        };
        Ok(catalog)
    }
}
