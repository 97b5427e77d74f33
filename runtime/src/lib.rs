//! Fabric Runtime: a workflow-graph runtime for staged LLM routes.
//!
//! Code map, in the order data flows:
//!
//! - [`catalogue`]: files under `routes/` → located YAML trees → definitions → cross-checked
//!   catalogue, every problem a [`diag::Diagnostic`] (`path:line:col: message`).
//! - [`prompt`]: prompt packs and the four prompt resolution paths.
//! - [`hydrate`]: a route becomes a petgraph graph of nodes stamped with role and prompt.
//! - [`exec`]: the walker; runs stages, builds the user message, keeps notes and slots.
//! - [`agent`]: the Mode 1 decision loop (Pattern 1) and the decision readers.
//! - [`llm`]: the LLM port, its decorators ([`llm::telemetry`]) and backends ([`llm::stub`]).
//! - [`structured`]: Python-parity JSON reading, validation and serialisation of replies.
//! - [`tools`]: hardened HTTP tool calls.
//! - [`events`]: run events and their sinks; [`otel`]: OpenTelemetry spans and export.
//! - [`config`]: environment settings.
//! - [`cli`]: the `fabric` command; [`bench`]: `fabric bench`; [`toolserver`]: `fabric tool-server`.

pub mod agent;
pub mod bench;
pub mod cancel;
pub mod catalogue;
pub mod cli;
pub mod config;
pub mod diag;
pub mod events;
pub mod exec;
pub mod hydrate;
pub mod llm;
pub mod otel;
pub mod prompt;
pub mod redact;
pub mod structured;
pub mod textfile;
pub mod tools;
pub mod toolserver;
