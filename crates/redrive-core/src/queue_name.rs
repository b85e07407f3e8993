//! Queue names: `[A-Za-z0-9._:-]{1,128}`.

/// The longest queue name, in bytes.
pub const MAX_QUEUE_NAME_BYTES: usize = 128;

/// A queue name outside `[A-Za-z0-9._:-]{1,128}`.
#[derive(Debug, thiserror::Error)]
#[error("bad queue name {0:?}: use 1 to 128 characters of A-Z a-z 0-9 . _ : -")]
pub struct QueueNameError(pub String);

/// Check a queue name.
pub fn validate_queue_name(name: &str) -> Result<(), QueueNameError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_QUEUE_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(QueueNameError(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_rejects() {
        assert!(validate_queue_name("orders.paid:v1-eu_2").is_ok());
        assert!(validate_queue_name("").is_err());
        assert!(validate_queue_name("a b").is_err());
        assert!(validate_queue_name("订单").is_err());
        assert!(validate_queue_name(&"x".repeat(128)).is_ok());
        assert!(validate_queue_name(&"x".repeat(129)).is_err());
    }
}
