//! Taking records from librdkafka at line rate: a record already queued is taken without waiting and without
//! reading the clock (a clock read per record was the largest single cost of the copy loops); the clock is read
//! only when the queue is empty.

use std::time::{Duration, Instant};

use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaResult;
use rdkafka::message::BorrowedMessage;

/// How long one wait for records lasts at most, so that callers notice deadlines and shutdown.
pub const POLL_WAIT: Duration = Duration::from_millis(100);

/// Check a batch's deadline once per this many records taken without waiting.
pub const DEADLINE_CHECK_EVERY: u64 = 1024;

/// What [`next_message`] found.
pub enum Polled<'c> {
    /// A record, or the consumer's error.
    Message(KafkaResult<BorrowedMessage<'c>>),
    /// Nothing arrived within [`POLL_WAIT`].
    Nothing,
    /// Nothing was queued and `deadline` has passed.
    DeadlinePassed,
}

/// The next record of `consumer`: one already queued at once; otherwise waits up to [`POLL_WAIT`] or until
/// `deadline`, whichever comes first.
pub fn next_message(consumer: &BaseConsumer, deadline: Option<Instant>) -> Polled<'_> {
    if let Some(message) = consumer.poll(Duration::ZERO) {
        return Polled::Message(message);
    }
    let wait = match deadline {
        None => POLL_WAIT,
        Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => left.min(POLL_WAIT),
            _ => return Polled::DeadlinePassed,
        },
    };
    match consumer.poll(wait) {
        Some(message) => Polled::Message(message),
        None => Polled::Nothing,
    }
}
