//! Deterministic pseudo-random numbers for the kernel tests (xorshift64*), shared by the test
//! binaries through `#[path]`.

/// A xorshift64* generator; the seed must not be zero.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}
