//! The commands of the binary, and how a failure becomes an exit code.

pub mod backup;
pub mod client;
pub mod groups;
pub mod import;
pub mod output;
pub mod policy;
pub mod serve;
pub mod tasks;

// The failure type, its exit codes and the error printer: shared with `redrive-bench`.
pub use redrive_client::cli::{finish, usage, CliError};
