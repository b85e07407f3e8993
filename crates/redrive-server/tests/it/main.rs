//! HTTP integration tests: a real server (embedded store in a temp dir, fsync on)
//! on an ephemeral loopback port, driven with reqwest.

mod e2e_alerts;
mod e2e_auth;
mod e2e_bad_input;
mod e2e_bridge;
mod e2e_browser;
mod e2e_cluster;
mod e2e_contract;
mod e2e_engine;
mod e2e_leases;
mod e2e_limits;
mod e2e_operator;
mod e2e_ops_files;
mod e2e_ordering;
mod e2e_php_worker;
mod e2e_publish;
mod e2e_push;
mod e2e_push_cluster;
mod e2e_queues_ops;
mod e2e_smoke;
mod e2e_sql_publish;
mod e2e_tasks;
mod e2e_ui;
mod harness;
