//! Exactly-once Kafka sink over Kafka's transactional producer ([`KafkaSink`]).
//!
//! # Guarantee
//! Each checkpoint's records are one Kafka transaction, committed only after the checkpoint record is durable:
//! `isolation.level=read_committed` readers see every record exactly once; aborted and in-flight records never.
//!
//! # Mechanism
//! - Transactional ids come from a small bounded pool per subtask, `<prefix>-<subtask>-<slot>`
//!   ([`TransactionalIdPool`], 2 slots by default so checkpoint N commits while N+1 writes); never one id per
//!   checkpoint (Flink's id explosion).
//! - `pre_commit` waits for every delivery, then asks the transaction coordinator for the transaction's producer
//!   id and epoch ([`describe_transaction`], DescribeTransactions / KIP-664) and records them, with the offsets
//!   written per partition, in the committable.
//! - `commit` goes through librdkafka when this process still holds the transaction; otherwise (recovery after
//!   the process died) [`end_transaction`] sends EndTxn with the recorded producer id and epoch, committing the
//!   dead producer's transaction exactly as it would have. This is what librdkafka cannot do (Flink needs
//!   reflection on producer internals, Arroyo has no commit-phase recovery, its issue #224).
//! - Idempotence: a transaction the coordinator reports as `CompleteCommit` for the same producer id (epoch equal,
//!   or one higher under transaction protocol v2, KIP-890) is done; if the id has moved on since, a
//!   read_committed probe of the recorded offsets asks the log itself.
//! - At start the sink claims its transactional-id prefix in a registry topic ([`claim_prefix`]) and refuses to
//!   run when another job holds it.
//! - `recover` commits the restored transactions first, then calls `init_transactions` on every id of the pool:
//!   that fences zombies and aborts whatever a crashed attempt left open, so read_committed readers are never
//!   stuck behind the last stable offset.
//! - The sink declares `transaction_timeout` to the driver's timeout budget (checkpoint interval, commit waits, restart
//!   and recovery must fit in it), and `recover` refuses a `transaction_timeout` above the broker's
//!   `transaction.max.timeout.ms`, read from the broker ([`broker_max_transaction_timeout`]).
//!
//! - Every client the sink makes (transactional producers, the log probe, the prefix registry, admin requests,
//!   Kafka-to-Kafka's consumer, and the protocol-level commit path) starts from one
//!   [`KafkaConnection`] ([`KafkaSinkConfig::kafka_connection`]): the
//!   bootstrap servers and the connection settings of `client` (`security.protocol`, `ssl.*`, `sasl.*`,
//!   `socket.*`). PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL with PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 work for
//!   all of them (tested against a SASL_SSL listener); settings only librdkafka could follow (GSSAPI, OAUTHBEARER,
//!   PKCS#12 key stores, encrypted keys) are refused at construction, naming the setting
//!   ([`KafkaSinkConfig::validate`]).
//!
//! - Kafka-to-Kafka ([`KafkaToKafka`]): when the source is the same cluster, the consumed offsets go into the
//!   same transaction (`send_offsets_to_transaction` with the consumer group metadata), so no external checkpoint
//!   store is needed.
//!
//! # Failure table
//! | crash point | broker state | recovery |
//! |---|---|---|
//! | before pre-commit | transaction open, not in any record | `init_transactions` aborts it; the source replays |
//! | after pre-commit, before the record is durable | transaction open | aborted by `init_transactions` (presumed abort) |
//! | after the record is durable, before commit | transaction open, in the record | EndTxn commits it with the recorded producer id and epoch |
//! | after commit | `CompleteCommit` | recognised as committed; nothing changes |
//! | the broker aborted it first (`transaction.timeout.ms` expired) | `CompleteAbort` | stops with an error naming the checkpoint and the lost topic/partition/offset ranges; never pretends |
//! | after the record is durable, then the transaction's records were removed from the log (DeleteRecords, retention, compaction) while its id moved on (re-initialised, expired) | the coordinator no longer tracks it; the records that would tell (each range's first and last) are gone; while one of them is left, it decides | stops in doubt (`InDoubt`): nothing committed, aborted or reported lost; the error names the checkpoint, the removed ranges and the log start, and says what to check (read_committed readers, the end marker in `kafka-dump-log.sh`) and what to do either way |
#![deny(missing_docs)]

mod at_least_once;
mod avro_values;
mod broker;
mod check;
mod commit;
mod committable;
mod config;
mod coordinator;
mod delivery;
mod error;
mod factory;
mod json_schema_values;
mod kafka_to_kafka;
mod outcome;
mod probe;
mod producer;
mod protobuf_schema;
mod protobuf_values;
mod records;
mod recovery;
mod registered_subject;
mod registry;
mod sender;
mod sink;
mod txn_id;
mod types;

pub use at_least_once::{KafkaAtLeastOnceSink, NothingToCommit};
pub use broker::broker_max_transaction_timeout;
pub use commit::KafkaCommitter;
pub use committable::{FlushedRecords, KafkaCommittable, PartitionRange};
pub use config::KafkaSinkConfig;
pub use coordinator::{
    CoordinatorClient, TransactionDescription, TransactionState, describe_transaction,
    end_transaction, find_transaction,
};
pub use delivery::{DeliveryTracker, SinkProducer};
pub use error::classify;
pub use factory::{KafkaSinkFactory, with_job_defaults};
pub use kafka_connection::KafkaConnection;
pub use kafka_to_kafka::{
    CommitObserver, CommittedTransaction, KafkaToKafka, PipelineHook, PipelineStats,
};
pub use producer::open_transactional_producer;
pub use records::{RecordMapping, ValueFormat};
pub use registry::{PREFIX_REGISTRY_TOPIC, claim_prefix};
pub use sink::KafkaSink;
pub use txn_id::{TransactionalId, TransactionalIdPool};
