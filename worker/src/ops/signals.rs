//! What the worker does on a second SIGTERM or SIGINT: the first one stops it gracefully (the job loop or the fast
//! path finishes its checkpoint), a second one exits at once.

/// Exits at once on a second signal.
#[allow(clippy::disallowed_methods)] // the one place the worker ends its process
pub fn fast_exit() -> ! {
    eprintln!(
        "second signal: exiting now; checkpointed records are safe (the next start commits them), later ones are \
         replayed"
    );
    std::process::exit(130)
}
