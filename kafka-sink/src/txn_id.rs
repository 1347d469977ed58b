//! Deterministic transactional ids from a small bounded pool per subtask.

use std::fmt;

use connector_api::{CheckpointId, Error, ErrorKind, Phase, Result, SubtaskId};

/// One transactional id: `<prefix>-<subtask>-<slot>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TransactionalId(String);

impl TransactionalId {
    /// The id as librdkafka's `transactional.id`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TransactionalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fixed set of transactional ids one subtask uses, reused round-robin by checkpoint.
///
/// Two slots are enough for the driver's overlap (checkpoint N committing while N+1 is written); the pool never
/// grows, so the broker's transaction state stays bounded and recovery can enumerate every id a subtask may have
/// left a transaction open on.
#[derive(Debug, Clone)]
pub struct TransactionalIdPool {
    prefix: String,
    size: u32,
}

impl TransactionalIdPool {
    /// A pool of `size` ids per subtask under `prefix` (letters, digits, `.`, `_`, `-`, `~`; at most 200
    /// characters; `~` is what a job-scoped default prefix, `<job>~<sink>`, has).
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) naming the setting.
    pub fn new(prefix: impl Into<String>, size: u32) -> Result<Self> {
        let invalid = |message: String| Error::new(ErrorKind::Config, Phase::Setup, message);
        let prefix = prefix.into();
        if prefix.is_empty()
            || prefix.len() > 200
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'~'))
        {
            return Err(invalid(format!(
                "transactional_id_prefix {prefix:?} is invalid: use 1 to 200 ASCII letters, digits, '.', '_', '-' or '~'"
            )));
        }
        if !(2..=16).contains(&size) {
            return Err(invalid(format!(
                "transactional_id_pool_size {size} is out of range: use 2 to 16. Checkpoint N commits on its own \
                 task while checkpoint N+1 is written, so two consecutive checkpoints need two transactional ids \
                 (one id would be one producer in two transactions at once)"
            )));
        }
        Ok(Self { prefix, size })
    }

    /// The id a subtask uses for `checkpoint`.
    pub fn for_checkpoint(&self, subtask: SubtaskId, checkpoint: CheckpointId) -> TransactionalId {
        self.id(subtask, (checkpoint.0 % u64::from(self.size)) as u32)
    }

    /// Every id of a subtask: what recovery fences and aborts.
    pub fn all(&self, subtask: SubtaskId) -> Vec<TransactionalId> {
        (0..self.size).map(|slot| self.id(subtask, slot)).collect()
    }

    fn id(&self, subtask: SubtaskId, slot: u32) -> TransactionalId {
        TransactionalId(format!("{}-{subtask}-{slot}", self.prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_cycle_through_a_bounded_pool() {
        let pool = TransactionalIdPool::new("orders-sink", 2).unwrap();
        let ids: Vec<_> = (1..=5)
            .map(|c| {
                pool.for_checkpoint(SubtaskId(3), CheckpointId(c))
                    .to_string()
            })
            .collect();
        assert_eq!(
            ids,
            [
                "orders-sink-3-1",
                "orders-sink-3-0",
                "orders-sink-3-1",
                "orders-sink-3-0",
                "orders-sink-3-1"
            ]
        );
        assert_eq!(pool.all(SubtaskId(3)).len(), 2);
    }

    #[test]
    fn refuses_bad_prefixes_and_sizes() {
        assert!(
            TransactionalIdPool::new("", 2)
                .unwrap_err()
                .to_string()
                .contains("transactional_id_prefix")
        );
        assert!(TransactionalIdPool::new("a b", 2).is_err());
        for size in [0, 1, 17] {
            assert!(
                TransactionalIdPool::new("ok", size)
                    .unwrap_err()
                    .to_string()
                    .contains("pool_size"),
                "{size}"
            );
        }
    }
}
