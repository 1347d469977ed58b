//! Randomness a failing run can replay: a small deterministic generator seeded from `RATCHET_CHAOS_SEED` (or the
//! clock; the test prints it), and numbers read from the environment.

/// A small deterministic generator (xorshift64*), so a failing run can be replayed from its seed.
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The environment variable `name` as a number, if set.
///
/// # Panics
/// It is set to something else.
#[allow(clippy::disallowed_methods)] // a test's seed and size come from the environment
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

/// `RATCHET_CHAOS_SEED`, or a new seed.
pub fn seed() -> u64 {
    env_u64("RATCHET_CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    })
}
