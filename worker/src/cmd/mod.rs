//! The commands, one file each, side by side: each loads the job file, then works through [`crate::job`],
//! [`crate::jobstore`], [`crate::membership`] and [`crate::subtask`], never through another command.

pub mod awaiting;
pub mod check;
pub mod demo;
pub mod fast_path;
pub mod forget;
pub mod operate;
pub mod rescale;
pub mod run;
