//! Crash-safe small-file primitives on a local filesystem, shared by the local checkpoint store and the local file
//! sink: an exclusive lock with a bounded wait, and atomic replacement of a small file.

use std::fs::{self, File, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Takes an exclusive `flock` on `path` (created if missing), waiting at most `wait`; the lock is released when the
/// returned file is dropped or the process dies.
///
/// # Errors
/// [`WouldBlock`](std::io::ErrorKind::WouldBlock) when another process (or another open of the file in this one)
/// held the lock for all of `wait`, with a message naming the file; other I/O errors as they come.
pub fn lock_exclusive(path: &Path, wait: Duration) -> std::io::Result<File> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let deadline = Instant::now() + wait;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::Error(e)) => return Err(e),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(TryLockError::WouldBlock) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    format!(
                        "{} stayed locked for {wait:?}: another process holds it (paused?); stop it, or wait",
                        path.display()
                    ),
                ));
            }
        }
    }
}

/// Writes `bytes` to a new temporary file in `dir` whose name no other writer uses (process id and a counter), and
/// fsyncs it. The caller links or renames it into place.
pub fn write_unique_tmp(dir: &Path, what: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{what}.{}.{n}.tmp", std::process::id()));
    let mut file = File::create_new(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    Ok(tmp)
}

/// Replaces `path` (in directory `dir`) with `bytes` atomically and durably: unique temporary file, fsync, rename,
/// directory fsync. A reader sees the old or the new content, never a mix.
pub fn replace_file(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = write_unique_tmp(dir, "replace", bytes)?;
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(dir)
}

/// Fsyncs a directory, making renames and links in it durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Reads an unsigned number from a small file; `None` when the file does not exist.
///
/// # Errors
/// [`InvalidData`](std::io::ErrorKind::InvalidData) naming the file when it holds something else.
pub fn read_number(path: &Path) -> std::io::Result<Option<u64>> {
    match fs::read_to_string(path) {
        Ok(text) => text.trim().parse().map(Some).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} holds {text:?}, not a number: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_numbers_atomically_and_locks_exclusively() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        assert_eq!(read_number(&path).unwrap(), None);
        replace_file(dir.path(), &path, b"7").unwrap();
        replace_file(dir.path(), &path, b"8").unwrap();
        assert_eq!(read_number(&path).unwrap(), Some(8));

        let lock = dir.path().join(".lock");
        let held = lock_exclusive(&lock, Duration::ZERO).unwrap();
        let err = lock_exclusive(&lock, Duration::from_millis(20)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
        drop(held);
        lock_exclusive(&lock, Duration::ZERO).unwrap();
    }
}
