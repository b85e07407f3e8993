//! Start a real server for a test.

use redrive_server::{Config, Server};
use serde_json::Value;
use std::net::SocketAddr;
use tokio::sync::oneshot;

/// A running server; shut down (gracefully) on drop of `stop`.
pub struct TestServer {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    pub _dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    /// Start with the default config plus `toml` (may be empty).
    pub async fn start(toml_text: &str) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("redrive.toml");
        std::fs::write(&path, toml_text).unwrap();
        let overrides = redrive_server::Overrides {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some(dir.path().join("data")),
        };
        let config = Config::load(Some(&path), Vec::new(), &overrides).unwrap();
        let server = Server::bind(config).await.unwrap();
        let addr = server.local_addr();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .run(async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        TestServer {
            addr,
            client: reqwest::Client::new(),
            _dir: dir,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// POST JSON, return (status, body).
    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// POST a raw body.
    pub async fn post_raw(&self, path: &str, body: &str) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        let r = self.client.delete(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Graceful stop, waiting for the store to close.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
    }
}

/// Assert an error answer: status and code.
pub fn assert_error(got: &(u16, Value), status: u16, code: &str) {
    assert_eq!(got.0, status, "body: {}", got.1);
    assert_eq!(got.1["error"]["code"], code, "body: {}", got.1);
    assert!(
        got.1["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "body: {}",
        got.1
    );
}
