//! The counters of one subtask run, shared between the subtask (which counts) and the supervisor, `/health` and
//! the progress line (which read).

use std::sync::atomic::{AtomicBool, AtomicU64};

/// Counters of one subtask run, read by the progress line, the idle check and the restart policy.
#[derive(Debug)]
pub struct Progress {
    /// Records read and written to every sink.
    pub records: AtomicU64,
    /// Checkpoints decided.
    pub checkpoints: AtomicU64,
    /// When a record was last read, or the run started (milliseconds since the process started): for the idle
    /// check.
    pub last_activity_ms: AtomicU64,
    /// When this run read its first record (milliseconds since the process started; `u64::MAX`: none yet).
    pub first_record_ms: AtomicU64,
    /// When this run read its last record so far (milliseconds since the process started; 0: none yet).
    pub last_record_ms: AtomicU64,
    /// When this run last completed its checkpoint cycle: a checkpoint, or an interval with nothing to checkpoint
    /// (milliseconds since the process started; `u64::MAX`: still recovering). For `/ready`.
    pub last_cycle_ms: AtomicU64,
    /// When the source's last metadata refresh began (milliseconds since the process started; 0: none yet): the
    /// idle check counts a subtask idle only once a refresh began after its idle time was up, so partitions or
    /// topics added meanwhile are found first.
    pub refreshed_ms: AtomicU64,
    /// When the source was last seen handing out everything up to every partition's end (watermarks read at that
    /// moment, after the last refresh: partitions it added included; milliseconds since the process started; 0:
    /// never). The idle check counts a subtask idle only once this follows its refresh: records of a partition a
    /// refresh just added are read first.
    pub caught_up_ms: AtomicU64,
    /// Set by the idle check: the source should refresh its metadata now.
    pub refresh_wanted: AtomicBool,
}

impl Progress {
    /// The counters of a run starting `now` (milliseconds since the process started).
    pub fn starting_at(now: u64) -> Self {
        Self {
            records: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            last_activity_ms: AtomicU64::new(now),
            first_record_ms: AtomicU64::new(u64::MAX),
            last_record_ms: AtomicU64::new(0),
            last_cycle_ms: AtomicU64::new(u64::MAX),
            refreshed_ms: AtomicU64::new(0),
            caught_up_ms: AtomicU64::new(0),
            refresh_wanted: AtomicBool::new(false),
        }
    }
}
