//! The scenario × outcome table.

use std::fmt;

/// The outcome of one scenario.
#[derive(Debug, Clone)]
pub struct ReportRow {
    /// Scenario name.
    pub scenario: String,
    /// Crashes injected.
    pub crashes: u32,
    /// Driver starts (1 + restarts).
    pub starts: u32,
    /// Checkpoints that became durable.
    pub checkpoints: u64,
    /// Restarts whose recovery was checked against the plan `inspect` made before it (inspect matches recover).
    pub plans_checked: u32,
    /// `Ok` or what went wrong.
    pub outcome: Result<(), String>,
}

/// The result of a conformance run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target's name.
    pub target: String,
    /// One row per scenario.
    pub rows: Vec<ReportRow>,
}

impl Report {
    /// Whether every scenario passed.
    pub fn passed(&self) -> bool {
        self.rows.iter().all(|r| r.outcome.is_ok())
    }

    /// The rows that failed.
    pub fn failures(&self) -> Vec<&ReportRow> {
        self.rows.iter().filter(|r| r.outcome.is_err()).collect()
    }

    /// Panics with the table unless every scenario passed.
    pub fn assert_passed(&self) {
        assert!(self.passed(), "conformance failed:\n{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "conformance of {}:", self.target)?;
        writeln!(
            f,
            "| scenario | crashes | starts | checkpoints | plans checked | outcome |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|")?;
        for row in &self.rows {
            let outcome = match &row.outcome {
                Ok(()) => "PASS".to_string(),
                Err(why) => format!("FAIL: {}", why.replace('\n', " ")),
            };
            writeln!(
                f,
                "| {} | {} | {} | {} | {} | {outcome} |",
                row.scenario, row.crashes, row.starts, row.checkpoints, row.plans_checked
            )?;
        }
        let failed = self.failures().len();
        write!(
            f,
            "{} scenarios: {} passed, {failed} failed",
            self.rows.len(),
            self.rows.len() - failed
        )
    }
}
