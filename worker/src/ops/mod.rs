//! What operators watch and rehearse: metrics and the progress counters, `/health` and `/ready`, consumer lag in
//! Kafka's own tools, crash and pause drills, and the second-signal exit.

pub mod drill;
pub mod health;
pub mod lag;
pub mod progress;
pub mod signals;
pub mod telemetry;
