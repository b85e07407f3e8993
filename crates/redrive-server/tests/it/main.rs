//! HTTP integration tests: a real server (embedded store in a temp dir, fsync on)
//! on an ephemeral loopback port, driven with reqwest.

mod e2e_smoke;
mod harness;
