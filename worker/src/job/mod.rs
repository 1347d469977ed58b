//! What a job writes to: its sink entries (routed by topic or not), its dead-letter sink, and the one assembly of
//! a subtask's sink instances that every command uses.

pub mod assemble;
pub mod dead_letter;
pub mod preflight;
pub mod rescale;
pub mod routing;
pub mod shaping;
pub mod sinks;
