//! What the two command-line front ends of this client share (feature `cli`): the `redrive`
//! CLI and the load generator `redrive-bench`. Exit codes, how a client error becomes one,
//! the `--server` flag's parser, and printing JSON on stdout.
//!
//! Exit codes: 0 success; 1 the server answered an error (or any other failure); 2 bad
//! command-line input or configuration; 3 the server could not be reached.

use crate::Error;
use reqwest::Url;
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

/// A client error as the CLI reports it: the server's error is [`CliError::Api`] (exit 1),
/// no answer is [`CliError::Unreachable`] (exit 3), a bad token is a usage error (exit 2);
/// anything else exits 1 with its cause chain.
pub fn cli_error(e: Error) -> anyhow::Error {
    match e {
        Error::Api { code, message, .. } => CliError::Api { code, message }.into(),
        Error::Unreachable { url, cause } => CliError::Unreachable { url, cause }.into(),
        Error::Timeout { url } => CliError::Unreachable {
            url,
            cause: "timed out".into(),
        }
        .into(),
        Error::InvalidToken => usage("--token: not a valid header value"),
        other => anyhow::Error::new(other),
    }
}

/// `--server`: an http URL (this build has no TLS).
pub fn parse_server_url(s: &str) -> Result<Url, String> {
    let url = Url::parse(s).map_err(|e| format!("not a URL ({e}), e.g. http://127.0.0.1:7070"))?;
    match url.scheme() {
        "http" => Ok(url),
        "https" => Err(
            "https is not supported by this build (no TLS); use http:// on loopback or a TLS proxy"
                .into(),
        ),
        other => Err(format!("unsupported scheme {other:?}; use http://")),
    }
}

/// Write `text` to stdout. A reader that went away (`redrive … | head`) is not an error:
/// the output is simply not wanted any more (a `print!` would panic there).
pub fn emit(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    quiet_broken_pipe(out.write_all(text.as_bytes()).and_then(|()| out.flush()))
}

/// `r`, with a closed reader (broken pipe) counted as success.
pub fn quiet_broken_pipe(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// Print a value as pretty JSON on stdout. The client's typed answers encode to the
/// server's JSON; going through a `serde_json::Value` first prints their keys in the
/// order a parsed answer had (sorted), as the CLI always printed them.
pub fn print_json<T: serde::Serialize + ?Sized>(value: &T) {
    match serde_json::to_value(value).and_then(|v| serde_json::to_string_pretty(&v)) {
        Ok(s) => {
            if let Err(e) = emit(&format!("{s}\n")) {
                eprintln!("error: cannot write the answer: {e}");
            }
        }
        Err(e) => eprintln!("error: cannot print the answer as JSON: {e}"),
    }
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

    #[test]
    fn client_errors_keep_their_exit_codes() {
        let api = cli_error(Error::Api {
            status: 404,
            code: "not_found".into(),
            message: "no message 01J".into(),
            settled: None,
        });
        assert_eq!(api.to_string(), "not_found: no message 01J");
        let code = |e: &anyhow::Error| e.downcast_ref::<CliError>().map(CliError::exit_code);
        assert_eq!(code(&api), Some(1));
        let down = cli_error(Error::Unreachable {
            url: "http://127.0.0.1:1/".into(),
            cause: "Connection refused (os error 111)".into(),
        });
        assert_eq!(code(&down), Some(3));
        let slow = cli_error(Error::Timeout {
            url: "http://127.0.0.1:1/".into(),
        });
        assert_eq!(code(&slow), Some(3));
        assert!(slow.to_string().contains("timed out"), "{slow}");
        assert_eq!(code(&cli_error(Error::InvalidToken)), Some(2));
    }

    #[test]
    fn server_urls_are_http_only() {
        assert!(parse_server_url("http://127.0.0.1:7070").is_ok());
        assert!(parse_server_url("https://example.com")
            .unwrap_err()
            .contains("no TLS"));
        assert!(parse_server_url("ftp://x").is_err());
        assert!(parse_server_url("127.0.0.1:7070").is_err());
    }

    #[test]
    fn json_keys_print_in_the_order_of_a_parsed_answer() {
        #[derive(serde::Serialize)]
        struct Answer {
            state: &'static str,
            id: u8,
        }
        let typed = serde_json::to_value(Answer {
            state: "ready",
            id: 1,
        })
        .unwrap();
        let parsed: serde_json::Value =
            serde_json::from_str(r#"{"state":"ready","id":1}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&typed).unwrap(),
            serde_json::to_string(&parsed).unwrap()
        );
    }
}
