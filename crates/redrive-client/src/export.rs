//! A streamed export (`GET /v1/messages/export`): read it chunk by chunk (to copy it to a
//! file without holding it in memory) or, for `jsonl`, message by message.

use crate::Error;
use bytes::{Buf, Bytes, BytesMut};
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use redrive_core::Message;
use reqwest::Url;

/// An export whose answer has started (status 2xx); the body follows.
pub struct Export {
    /// The body, as it arrives.
    chunks: BoxStream<'static, reqwest::Result<Bytes>>,
    /// Bytes received and not yet handed out as a line (jsonl reading only).
    pending: BytesMut,
    /// Set once the body ended.
    ended: bool,
    /// For errors.
    url: Url,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("url", &self.url.as_str())
            .field("pending", &self.pending.len())
            .field("ended", &self.ended)
            .finish()
    }
}

impl Export {
    pub(crate) fn new(resp: reqwest::Response, url: Url) -> Self {
        Self {
            chunks: resp.bytes_stream().boxed(),
            pending: BytesMut::new(),
            ended: false,
            url,
        }
    }

    /// The next chunk of the body as sent, `None` at its end. An export cut short (the
    /// server stopped mid-way) is an [`Error::Interrupted`], never a silent end.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, Error> {
        if !self.pending.is_empty() {
            return Ok(Some(self.pending.split().freeze()));
        }
        if self.ended {
            return Ok(None);
        }
        match self.chunks.next().await {
            Some(Ok(b)) => Ok(Some(b)),
            Some(Err(source)) => Err(Error::Interrupted {
                url: self.url.to_string(),
                source,
            }),
            None => {
                self.ended = true;
                Ok(None)
            }
        }
    }

    /// The next line of the body, without its `\n`; `None` at the end.
    pub async fn next_line(&mut self) -> Result<Option<Bytes>, Error> {
        loop {
            if let Some(i) = self.pending.iter().position(|b| *b == b'\n') {
                let mut line = self.pending.split_to(i + 1);
                line.truncate(i);
                return Ok(Some(line.freeze()));
            }
            if self.ended {
                if self.pending.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(self.pending.split().freeze()));
            }
            match self.chunks.next().await {
                Some(Ok(b)) => self.pending.extend_from_slice(b.chunk()),
                Some(Err(source)) => {
                    return Err(Error::Interrupted {
                        url: self.url.to_string(),
                        source,
                    })
                }
                None => self.ended = true,
            }
        }
    }

    /// The next message of a `jsonl` export; `None` at the end. Blank lines are skipped.
    pub async fn next_message(&mut self) -> Result<Option<Message>, Error> {
        while let Some(line) = self.next_line().await? {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return serde_json::from_slice(&line)
                .map(Some)
                .map_err(|source| Error::Decode {
                    url: self.url.to_string(),
                    source,
                });
        }
        Ok(None)
    }
}
