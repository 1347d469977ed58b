//! What `ratchet run` processes report when they stop, and the rate of a job run by several of them.

/// What one worker process reported when it stopped.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stopped {
    pub records: u64,
    pub first_ms: u64,
    pub last_ms: u64,
    pub cpu_seconds: f64,
    pub peak_rss_mb: f64,
}

/// One measured job: records/s, CPU seconds per million records, peak RSS (largest process).
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    pub records_per_second: f64,
    pub cpu_per_million: f64,
    pub peak_rss_mb: f64,
}

impl Rate {
    pub fn of(runs: &[Stopped]) -> Self {
        let records: u64 = runs.iter().map(|r| r.records).sum();
        let first = runs
            .iter()
            .filter(|r| r.records > 0)
            .map(|r| r.first_ms)
            .min()
            .unwrap_or(0);
        let last = runs.iter().map(|r| r.last_ms).max().unwrap_or(0);
        let seconds = (last.saturating_sub(first)).max(1) as f64 / 1000.0;
        Self {
            records_per_second: records as f64 / seconds,
            cpu_per_million: runs.iter().map(|r| r.cpu_seconds).sum::<f64>()
                / (records as f64 / 1e6),
            peak_rss_mb: runs.iter().map(|r| r.peak_rss_mb).fold(0.0, f64::max),
        }
    }
}

/// The totals of the `stopped` line a worker logged (`--log-format json`).
pub fn stopped_line(log: &str) -> Stopped {
    let fields = log
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| v["fields"].clone())
        .find(|f| f["message"] == "stopped")
        .unwrap_or_else(|| panic!("no `stopped` line in:\n{log}"));
    Stopped {
        records: fields["records"].as_u64().unwrap(),
        first_ms: fields["first_record_unix_ms"].as_u64().unwrap(),
        last_ms: fields["last_record_unix_ms"].as_u64().unwrap(),
        cpu_seconds: fields["cpu_seconds"].as_f64().unwrap(),
        peak_rss_mb: fields["peak_rss_kb"].as_f64().unwrap() / 1024.0,
    }
}
