//! Environment overrides of job-file values, for secrets and per-machine settings: `RATCHET__<KEY>__<KEY>...=value`
//! sets the value at that path (keys case-insensitive, `__` between them, a number indexes an array such as
//! `sinks`): `RATCHET__STORE__URL`, `RATCHET__SINKS__2__CATALOG__URI`, `RATCHET__JOB__SUBTASKS=6`.
//!
//! A value replacing a string (or a key the file does not have) is taken as a string, so a numeric password stays
//! text; a value replacing a number, boolean or table is parsed as TOML.

use anyhow::{Context, Result, bail};
use toml::{Table, Value};

/// The prefix of override variables.
pub const PREFIX: &str = "RATCHET__";

/// Applies every `RATCHET__...` variable of `env` to `table`; returns how many there were.
///
/// # Errors
/// A path that goes through a value that is not a table or array, an array index out of range, or a value that
/// should be TOML and is not; each names the variable.
pub fn apply(table: &mut Table, env: impl IntoIterator<Item = (String, String)>) -> Result<usize> {
    let mut overrides: Vec<(String, String)> = env
        .into_iter()
        .filter(|(name, _)| name.starts_with(PREFIX))
        .collect();
    overrides.sort();
    let applied = overrides.len();
    for (name, value) in overrides {
        let path: Vec<String> = name[PREFIX.len()..]
            .split("__")
            .map(str::to_ascii_lowercase)
            .collect();
        set(table, &path, &value).with_context(|| format!("environment override {name}"))?;
        tracing::info!(variable = %name, "job file value overridden from the environment");
    }
    Ok(applied)
}

fn set(table: &mut Table, path: &[String], value: &str) -> Result<()> {
    if path.iter().any(String::is_empty) {
        bail!("has an empty key (three underscores in a row?)");
    }
    let (first, rest) = path.split_first().context("names no key")?;
    if rest.is_empty() {
        let replaced = parse_like(table.get(first.as_str()), value)?;
        table.insert(first.clone(), replaced);
        return Ok(());
    }
    let next = table
        .entry(first.clone())
        .or_insert_with(|| Value::Table(Table::new()));
    set_in(next, rest, value)
}

fn set_in(at: &mut Value, path: &[String], value: &str) -> Result<()> {
    match at {
        Value::Table(table) => set(table, path, value),
        Value::Array(items) => {
            let (first, rest) = path.split_first().context("names no key")?;
            let index: usize = first
                .parse()
                .with_context(|| format!("{first:?} is not an index into an array"))?;
            let len = items.len();
            let item = items.get_mut(index).with_context(|| {
                format!("index {index} is out of range: the array has {len} entries")
            })?;
            if rest.is_empty() {
                *item = parse_like(Some(item), value)?;
                return Ok(());
            }
            set_in(item, rest, value)
        }
        other => bail!(
            "goes through a {} value, not a table or array",
            other.type_str()
        ),
    }
}

/// `value` as a string when it replaces a string or nothing, otherwise as a TOML value.
fn parse_like(old: Option<&Value>, value: &str) -> Result<Value> {
    match old {
        None | Some(Value::String(_)) => Ok(Value::String(value.to_string())),
        Some(old) => {
            let parsed: Table = toml::from_str(&format!("v = {value}")).with_context(|| {
                format!(
                    "replaces a {} and {value:?} is not a TOML value (quote strings, use [..] for arrays)",
                    old.type_str()
                )
            })?;
            Ok(parsed.get("v").cloned().context("no value")?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn overrides_strings_numbers_and_array_entries() {
        let mut table: Table = toml::from_str(
            "[job]\nsubtasks = 1\n[store]\nurl = \"x\"\n[[sinks]]\nid = \"a\"\n[[sinks]]\nid = \"b\"\n",
        )
        .unwrap();
        apply(
            &mut table,
            vars(&[
                ("RATCHET__JOB__SUBTASKS", "4"),
                ("RATCHET__STORE__URL", "postgresql://u:123@h/db"),
                ("RATCHET__SINKS__1__PASSWORD", "123"),
                ("OTHER", "ignored"),
            ]),
        )
        .unwrap();
        assert_eq!(table["job"]["subtasks"].as_integer(), Some(4));
        assert_eq!(
            table["store"]["url"].as_str(),
            Some("postgresql://u:123@h/db")
        );
        assert_eq!(table["sinks"][1]["password"].as_str(), Some("123"));
        assert!(table["sinks"][0].get("password").is_none());
    }

    #[test]
    fn bad_paths_and_values_name_the_variable() {
        let mut table: Table =
            toml::from_str("[job]\nsubtasks = 1\n[[sinks]]\nid = \"a\"\n").unwrap();
        let err = format!(
            "{:#}",
            apply(&mut table, vars(&[("RATCHET__SINKS__3__ID", "x")])).unwrap_err()
        );
        assert!(
            err.contains("RATCHET__SINKS__3__ID") && err.contains("out of range"),
            "{err}"
        );
        let err = format!(
            "{:#}",
            apply(&mut table, vars(&[("RATCHET__JOB__SUBTASKS", "four")])).unwrap_err()
        );
        assert!(
            err.contains("RATCHET__JOB__SUBTASKS") && err.contains("integer"),
            "{err}"
        );
    }
}
