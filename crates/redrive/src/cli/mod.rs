//! The commands of the binary, and how a failure becomes an exit code.

pub mod backup;
pub mod client;
pub mod groups;
pub mod output;
pub mod policy;
pub mod serve;
pub mod tasks;

use std::fmt;
use std::process::ExitCode;

/// A failure with its own exit code. Any other error (an `anyhow` without one of
/// these inside) exits 1.
#[derive(Debug)]
pub enum CliError {
    /// Bad input on the command line, in stdin or in a config file: exit 2.
    Usage(String),
    /// The server answered an error (`{"error": {"code", "message"}}`): exit 1.
    Api {
        /// The error's code (or `http_<status>` when the body had none).
        code: String,
        /// The error's message.
        message: String,
    },
    /// The server could not be reached (refused, DNS, timeout): exit 3.
    Unreachable {
        /// The URL tried.
        url: String,
        /// Why, as reqwest put it.
        cause: String,
    },
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m) => f.write_str(m),
            CliError::Api { code, message, .. } => write!(f, "{code}: {message}"),
            CliError::Unreachable { url, cause } => write!(
                f,
                "cannot reach the redrive server at {url}: {cause} (is `redrive serve` running? see --server / REDRIVE_SERVER)"
            ),
        }
    }
}

impl std::error::Error for CliError {}

impl CliError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Api { .. } => 1,
            CliError::Unreachable { .. } => 3,
        }
    }
}

/// Print a command's error (`error: …` on stderr) and turn it into the exit code.
pub fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = e.downcast_ref::<CliError>().map_or(1, CliError::exit_code);
            eprintln!("error: {e:#}");
            ExitCode::from(code)
        }
    }
}

/// A usage error as an `anyhow::Error` (exit 2).
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    CliError::Usage(message.into()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_failure() {
        assert_eq!(CliError::Usage("x".into()).exit_code(), 2);
        let api = CliError::Api {
            code: "not_found".into(),
            message: "no such message".into(),
        };
        assert_eq!(api.exit_code(), 1);
        assert_eq!(api.to_string(), "not_found: no such message");
        let down = CliError::Unreachable {
            url: "http://127.0.0.1:1/".into(),
            cause: "refused".into(),
        };
        assert_eq!(down.exit_code(), 3);
    }

    #[test]
    fn an_anyhow_error_keeps_its_code() {
        let e = usage("PAYLOAD is not valid JSON");
        assert_eq!(
            e.downcast_ref::<CliError>().map(CliError::exit_code),
            Some(2)
        );
    }
}
