//! Fabric Runtime: a workflow-graph runtime for staged LLM routes.
//!
//! Modules in the order data flows; each imports only modules above it (a test checks):
//!
//! - leaves: [`diag`] (located problems), [`textfile`] (bounded reads), [`redact`] (URLs without
//!   secrets), [`cancel`], [`failure`] (reason classes), [`events`], [`structured`]
//!   (Python-parity replies), [`decision`] (the decision loop's replies), [`schedule`] (cron
//!   fire times and the scheduled runs' planner);
//! - built on leaves only: [`otel`], [`vocab`] (what the catalogue and the model port share:
//!   `OutputSpec`, provider kinds, model strings, `ConfigError`, the parity constants and tool
//!   limits), [`yaml`] (located YAML trees), [`source`] (catalogue files);
//! - [`defs`] → [`prompt`] → [`loader`] → [`hydrate`] → [`svg`] → [`catalogue`] → [`diff`]: files
//!   become definitions, prompts resolve, routes become graphs (and their SVG pictures), two
//!   catalogues are compared; no model port;
//! - [`llm`]: the model port, its decorators, the stub and the providers, and [`llm::model`]
//!   (targets, tuning, keys); [`config`]: settings from the environment; no catalogue;
//! - [`tools`]: the tool port (HTTP and in-process tools); [`exec`]: the walker and the decision
//!   loop; [`store`]: the run store;
//! - [`runtime`]: the facade every front end (`fabric`, `fabric serve`, Python) is a shell over;
//!   [`eval`]: evaluations over datasets (graded runs, experiments); [`api`]: the HTTP service.

pub mod api;
pub mod cancel;
pub mod catalogue;
pub mod config;
pub mod decision;
pub mod defs;
pub mod diag;
pub mod diff;
pub mod eval;
pub mod events;
pub mod exec;
pub mod failure;
pub mod hydrate;
pub mod llm;
pub mod loader;
pub mod otel;
pub mod prompt;
pub mod redact;
pub mod replica;
pub mod runtime;
pub mod schedule;
pub mod source;
pub mod store;
pub mod structured;
pub mod svg;
pub mod textfile;
pub mod tools;
pub mod version;
pub mod vocab;
pub mod yaml;
