//! A `ratchet run` process under test: signals, kill -9, a clean stop, its log.

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

/// A running `ratchet run` process.
pub struct Worker {
    pub child: Option<Child>,
    pub log: PathBuf,
}

impl Worker {
    fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.as_ref().unwrap().id() as i32)
    }

    /// Sends `signal`.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(self.pid(), signal).unwrap();
    }

    /// SIGKILL, and reaps it.
    pub fn kill9(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        self.child.take().unwrap().wait().unwrap();
    }

    /// SIGTERM, then waits for the exit (at most `within`) and asserts it was clean.
    pub fn stop(&mut self, within: Duration) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.wait_exit(within);
    }

    /// Waits for the exit (at most `within`) and asserts it was clean.
    pub fn wait_exit(&mut self, within: Duration) {
        let status = self.wait_status(within);
        assert!(
            status.success(),
            "worker exited with {status}:\n{}",
            self.log_text()
        );
    }

    /// Waits for the exit (at most `within`), asserts it failed, and returns its log.
    pub fn wait_failed(&mut self, within: Duration) -> String {
        let status = self.wait_status(within);
        assert!(
            !status.success(),
            "worker exited with {status}, expected a failure:\n{}",
            self.log_text()
        );
        self.log_text()
    }

    /// Waits for the exit (at most `within`) and asserts a drill killed it (SIGKILL).
    pub fn wait_killed(&mut self, within: Duration) {
        use std::os::unix::process::ExitStatusExt;
        let status = self.wait_status(within);
        assert_eq!(
            status.signal(),
            Some(9),
            "worker exited with {status}:\n{}",
            self.log_text()
        );
    }

    fn wait_status(&mut self, within: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "worker did not exit within {within:?}:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether it has exited, and how.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().unwrap().try_wait().unwrap()
    }

    /// What it logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until it has logged `text` at least `times` times; panics with its log after `within`.
    pub fn wait_logged(&self, text: &str, times: usize, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        while self.log_text().matches(text).count() < times {
            assert!(
                std::time::Instant::now() < deadline,
                "the worker did not log {text:?} {times} times within {within:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The test failed: show what the worker said (its directory goes with the test's).
            eprintln!("--- {} ---\n{}", self.log.display(), self.log_text());
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
