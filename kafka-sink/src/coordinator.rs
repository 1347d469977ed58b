//! Finishing a transaction at the protocol level, from any process: librdkafka cannot resume another process's
//! transaction, and `init_transactions` on its transactional id would abort it. The transaction coordinator
//! describes a transaction by its transactional id (DescribeTransactions, KIP-664: state, producer id, epoch,
//! partitions), and EndTxn with that producer id and epoch commits (or aborts) it, exactly as the producer that
//! began it would have.
//!
//! The wire format and the error codes come from the `kafka-protocol` crate; connections (TCP, TLS, SASL as the
//! sink's `client` settings say) come from [`KafkaConnection::open`]. Errors say [`Phase::Commit`]; a caller in
//! another step sets its own with [`Error::at_phase`](connector_api::Error::at_phase). Nothing here retries: a
//! transient error (the coordinator loads or moves) goes back to the step that knows whether a retry is safe. The
//! driver retries commit and recover, which are idempotent; the sink's pre-commit retries its one
//! DescribeTransactions itself ([`RetryPolicy::run_idempotent`](connector_api::RetryPolicy::run_idempotent)).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use tokio::sync::Mutex;

use connector_api::{Error, ErrorKind, Phase, Result};
use kafka_connection::{KafkaConnection, WireConnection};
use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};
use kafka_protocol::messages::{
    ApiKey, DescribeTransactionsRequest, EndTxnRequest, FindCoordinatorRequest, ProducerId,
    TransactionalId,
};
use kafka_protocol::protocol::StrBytes;

/// The transaction coordinator's state of a transactional id (`TransactionState` in the broker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransactionState {
    /// No transaction since the producer initialised the id.
    Empty,
    /// A transaction is open.
    Ongoing,
    /// EndTxn(commit) was accepted; markers are being written.
    PrepareCommit,
    /// EndTxn(abort) was accepted, or the broker aborts a timed-out transaction.
    PrepareAbort,
    /// The last transaction committed.
    CompleteCommit,
    /// The last transaction aborted.
    CompleteAbort,
    /// The id is being expired.
    Dead,
    /// A newer producer is fencing the current one.
    PrepareEpochFence,
    /// A state this release does not know.
    Other(String),
}

impl TransactionState {
    fn parse(state: &str) -> Self {
        match state {
            "Empty" => Self::Empty,
            "Ongoing" => Self::Ongoing,
            "PrepareCommit" => Self::PrepareCommit,
            "PrepareAbort" => Self::PrepareAbort,
            "CompleteCommit" => Self::CompleteCommit,
            "CompleteAbort" => Self::CompleteAbort,
            "Dead" => Self::Dead,
            "PrepareEpochFence" => Self::PrepareEpochFence,
            other => Self::Other(other.to_string()),
        }
    }
}

impl fmt::Display for TransactionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Other(state) => f.write_str(state),
            known => write!(f, "{known:?}"),
        }
    }
}

/// What the coordinator says about one transactional id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionDescription {
    /// The transaction's state.
    pub state: TransactionState,
    /// The producer id that owns the transactional id.
    pub producer_id: i64,
    /// Its current epoch.
    pub producer_epoch: i16,
    /// `transaction.timeout.ms` of the transaction.
    pub timeout_ms: i32,
    /// When the ongoing transaction started (ms since the epoch), or -1.
    pub start_time_ms: i64,
    /// The partitions in the transaction.
    pub partitions: Vec<(String, i32)>,
}

/// A broker's answer `error` to `request` about `transactional_id`: retryable when Kafka says so.
fn response_error(request: &str, transactional_id: &str, error: ResponseError) -> Error {
    let kind = if error.is_retriable() {
        ErrorKind::Retryable
    } else {
        ErrorKind::Fatal
    };
    Error::new(kind, Phase::Commit, format!("{request} was refused"))
        .with_txn(transactional_id)
        .with_source(error)
}

/// Talks to transaction coordinators, keeping the connection to each transactional id's coordinator open between
/// calls: a pre-commit's DescribeTransactions then costs one round trip instead of two TCP (and TLS, SASL)
/// handshakes, FindCoordinator and version negotiation. Clones share the connections.
///
/// A call that fails drops its connection (the coordinator may have moved, or the connection broke), so the next
/// call finds the coordinator again.
#[derive(Clone)]
pub struct CoordinatorClient {
    kafka: KafkaConnection,
    open: Arc<Mutex<HashMap<String, WireConnection>>>,
}

impl std::fmt::Debug for CoordinatorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorClient")
            .field("kafka", &self.kafka)
            .finish_non_exhaustive()
    }
}

impl CoordinatorClient {
    /// A client reaching the cluster through `kafka`; connections open on first use.
    pub fn new(kafka: KafkaConnection) -> Self {
        Self {
            kafka,
            open: Arc::default(),
        }
    }

    /// Runs `call` on a connection to the coordinator of `transactional_id`: the one kept from an earlier call,
    /// or a new one. The connection is kept only if `call` succeeds.
    async fn with_coordinator<T>(
        &self,
        transactional_id: &str,
        call: impl AsyncFnOnce(&mut WireConnection) -> Result<T>,
    ) -> Result<T> {
        let kept = self.open.lock().await.remove(transactional_id);
        let mut connection = match kept {
            Some(connection) => connection,
            None => coordinator(&self.kafka, transactional_id).await?,
        };
        let outcome = call(&mut connection).await;
        if outcome.is_ok() {
            self.open
                .lock()
                .await
                .insert(transactional_id.to_string(), connection);
        }
        outcome
    }

    /// Describes the transaction state of `transactional_id` (DescribeTransactions).
    ///
    /// # Errors
    /// [`Fatal`](ErrorKind::Fatal) when the broker does not know the id (it expired after
    /// `transactional.id.expiration.ms`, or never existed); see [`find_transaction`](Self::find_transaction)
    /// to tell that case apart.
    pub async fn describe_transaction(
        &self,
        transactional_id: &str,
    ) -> Result<TransactionDescription> {
        self.find_transaction(transactional_id)
            .await?
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Fatal,
                    Phase::Commit,
                    "the broker does not know this transactional id (expired after transactional.id.expiration.ms?)",
                )
                .with_txn(transactional_id)
            })
    }

    /// Describes the transaction state of `transactional_id`; `None` when the broker does not know the id
    /// (`TRANSACTIONAL_ID_NOT_FOUND`: it expired after `transactional.id.expiration.ms`, or never existed).
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) while the coordinator loads or moves, and for transport failures.
    pub async fn find_transaction(
        &self,
        transactional_id: &str,
    ) -> Result<Option<TransactionDescription>> {
        self.with_coordinator(transactional_id, async |connection| {
            describe(connection, transactional_id).await
        })
        .await
    }

    /// Commits (`commit = true`) or aborts the transaction of `transactional_id` owned by `producer_id` at
    /// `producer_epoch` (EndTxn), on behalf of the producer that began it.
    ///
    /// # Idempotence
    /// Ending a transaction that already completed the same way succeeds (the coordinator accepts the retry).
    ///
    /// # Errors
    /// [`Fenced`](ErrorKind::Fenced) when the producer id or epoch no longer own the transactional id (another
    /// producer initialised it); [`Fatal`](ErrorKind::Fatal) when the transaction already ended the other way (the
    /// broker aborted it after its timeout); [`Retryable`](ErrorKind::Retryable) for coordinator moves and
    /// concurrent transaction completion.
    pub async fn end_transaction(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
    ) -> Result<()> {
        self.with_coordinator(transactional_id, async |connection| {
            end(
                connection,
                transactional_id,
                producer_id,
                producer_epoch,
                commit,
            )
            .await
        })
        .await
    }
}

/// A connection to the transaction coordinator of `transactional_id`.
async fn coordinator(kafka: &KafkaConnection, transactional_id: &str) -> Result<WireConnection> {
    let mut connection = kafka.open_bootstrap().await?;
    let version = connection.version(ApiKey::FindCoordinator, 4).await?;
    let key = StrBytes::from_string(transactional_id.to_string());
    // Version 4 (KIP-699) takes a list of keys; older versions a single one.
    let request = if version >= 4 {
        FindCoordinatorRequest::default()
            .with_key_type(1)
            .with_coordinator_keys(vec![key])
    } else {
        FindCoordinatorRequest::default()
            .with_key_type(1)
            .with_key(key)
    };
    let response = connection.send(version, &request).await?;
    let (error, host, port) = match response.coordinators.first() {
        Some(c) if version >= 4 => (c.error_code, c.host.to_string(), c.port),
        _ => (
            response.error_code,
            response.host.to_string(),
            response.port,
        ),
    };
    match error.err() {
        None => kafka.open(&format!("{host}:{port}")).await,
        Some(e) => Err(response_error("FindCoordinator", transactional_id, e)),
    }
}

/// [`CoordinatorClient::describe_transaction`] on a fresh connection.
///
/// # Errors
/// As [`CoordinatorClient::describe_transaction`].
pub async fn describe_transaction(
    kafka: &KafkaConnection,
    transactional_id: &str,
) -> Result<TransactionDescription> {
    CoordinatorClient::new(kafka.clone())
        .describe_transaction(transactional_id)
        .await
}

/// [`CoordinatorClient::find_transaction`] on a fresh connection.
///
/// # Errors
/// As [`CoordinatorClient::find_transaction`].
pub async fn find_transaction(
    kafka: &KafkaConnection,
    transactional_id: &str,
) -> Result<Option<TransactionDescription>> {
    CoordinatorClient::new(kafka.clone())
        .find_transaction(transactional_id)
        .await
}

/// [`CoordinatorClient::end_transaction`] on a fresh connection.
///
/// # Errors
/// As [`CoordinatorClient::end_transaction`].
pub async fn end_transaction(
    kafka: &KafkaConnection,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
) -> Result<()> {
    CoordinatorClient::new(kafka.clone())
        .end_transaction(transactional_id, producer_id, producer_epoch, commit)
        .await
}

/// DescribeTransactions of `transactional_id` on its coordinator's `connection`.
async fn describe(
    connection: &mut WireConnection,
    transactional_id: &str,
) -> Result<Option<TransactionDescription>> {
    let request =
        DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(
            StrBytes::from_string(transactional_id.to_string()),
        )]);
    let response = connection.send(0, &request).await?;
    let state = response
        .transaction_states
        .into_iter()
        .next()
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Bug,
                Phase::Commit,
                "DescribeTransactions returned no state",
            )
            .with_txn(transactional_id)
        })?;
    match state.error_code.err() {
        None => {}
        Some(ResponseError::TransactionalIdNotFound) => return Ok(None),
        Some(e) => return Err(response_error("DescribeTransactions", transactional_id, e)),
    }
    Ok(Some(TransactionDescription {
        state: TransactionState::parse(&state.transaction_state),
        producer_id: state.producer_id.0,
        producer_epoch: state.producer_epoch,
        timeout_ms: state.transaction_timeout_ms,
        start_time_ms: state.transaction_start_time_ms,
        partitions: state
            .topics
            .into_iter()
            .flat_map(|t| {
                let topic = t.topic.to_string();
                t.partitions.into_iter().map(move |p| (topic.clone(), p))
            })
            .collect(),
    }))
}

/// EndTxn of `transactional_id` on its coordinator's `connection`.
async fn end(
    connection: &mut WireConnection,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
) -> Result<()> {
    tracing::info!(
        transactional_id,
        producer_id,
        producer_epoch,
        commit,
        coordinator = connection.address(),
        "ending a transaction at the protocol level (EndTxn)"
    );
    let version = connection.version(ApiKey::EndTxn, 5).await?;
    let request = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(StrBytes::from_string(
            transactional_id.to_string(),
        )))
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(producer_epoch)
        .with_committed(commit);
    let response = connection.send(version, &request).await?;
    let txn = format!("{transactional_id} (producer id {producer_id}, epoch {producer_epoch})");
    match response.error_code.err() {
        None => Ok(()),
        Some(e @ (ResponseError::InvalidProducerEpoch | ResponseError::ProducerFenced)) => Err(Error::new(
            ErrorKind::Fenced,
            Phase::Commit,
            "the producer epoch no longer owns the transactional id: another producer initialised it, or the broker \
             aborted the transaction (its timeout expired) and bumped the epoch",
        )
        .with_txn(txn)
        .with_source(e)),
        Some(e @ ResponseError::ConcurrentTransactions) => Err(Error::new(
            ErrorKind::Retryable,
            Phase::Commit,
            "EndTxn raced another completion of the same transaction",
        )
        .with_txn(txn)
        .with_source(e)),
        Some(e @ ResponseError::InvalidTxnState) => Err(Error::new(
            ErrorKind::Fatal,
            Phase::Commit,
            "EndTxn refused: the transaction is no longer open for this producer (the broker aborted it after its \
             transaction.timeout.ms, or it was ended the other way)",
        )
        .with_txn(txn)
        .with_source(e)),
        Some(e) => Err(response_error("EndTxn", transactional_id, e).with_txn(txn)),
    }
}
