//! nodeward: a node-local agent and a central scaler that give Kubernetes nodes a graceful life.
//!
//! The crate is one binary with subcommands (see [`cli`]); each capability lives in its own
//! module, with pure decisions separate from the I/O that acts on them (see ARCHITECTURE.md).

pub mod agent;
pub mod cli;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod drain;
pub mod events;
pub mod fsutil;
#[doc(hidden)]
pub mod fuzzing;
pub mod gate;
pub mod kube_client;
pub mod lease;
pub mod lifecycle;
pub mod logging;
pub mod logind;
pub mod metrics_http;
pub mod names;
pub mod node_write;
pub mod out_of_service;
pub mod readiness;
pub mod reboot;
pub mod render;
pub mod resources;
pub mod scaler;
pub mod secret;
pub mod selector;
pub mod shutdown;
pub mod store;
pub mod systemd;
pub mod task;
pub mod tomlfile;
pub mod validate;
pub mod window;
